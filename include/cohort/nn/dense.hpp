#pragma once
// Dense: y = x * kernel + bias over the last axis, as keras.layers.Dense (no built-in activation: add
// an Activation layer). Variables: kernel (in, units), glorot_uniform; bias (units), zeros.
//
//   model.add(nn::Dense(512));

#include "cohort/nn/layer.hpp"
#include "cohort/tensor/geometry.hpp"

namespace cohort::nn {

class Dense : public Layer {
 public:
  explicit Dense(int units, bool use_bias = true);

  std::string type_name() const override { return "Dense"; }
  bool capturable() const override { return true; }
  std::string name_stem() const override { return "dense"; }
  Shape build(const Shape& input_sample_shape, VariableFactory& factory) override;
  Tensor forward(const Tensor& x, const ForwardContext& context) override;
  Tensor backward(const Tensor& dy, bool need_input_gradient) override;
  // Absorbs an elementwise activation after it: applied with the bias, its gradient with the bias gradient.
  std::size_t absorb(std::span<const std::unique_ptr<Layer>> following, const ForwardContext& context) override;
  std::optional<LayerConfig> config() const override;
  std::int64_t multiply_adds_per_sample() const override { return rows_per_sample_ * input_features_ * units_; }

 private:
  int units_;
  bool use_bias_;
  std::int64_t input_features_ = 0, rows_per_sample_ = 0;
  VariablePtr kernel_, bias_;
  // Absorbed by absorb() for the next forward() only (a forward() called directly computes this layer alone),
  // and what that forward() applied, for its backward().
  cohort::Activation absorbed_activation_ = cohort::Activation::Linear, activation_ = cohort::Activation::Linear;
  Tensor input_rows_, output_, input_gradient_, output_gradient_;
  Tensor kernel_in_type_, bias_in_type_;  // the variables in a 16-bit input's type
  Tensor kernel_used_;                    // the kernel the last forward() multiplied with
};

}  // namespace cohort::nn
