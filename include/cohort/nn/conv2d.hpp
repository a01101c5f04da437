#pragma once
// Conv2D over NHWC input with an HWIO kernel, as keras.layers.Conv2D.
// Variables: kernel (k, k, in, filters), glorot_uniform; bias (filters), zeros.
//
//   model.add(nn::Conv2D(32, 3, nn::Padding::Same));

#include "cohort/nn/batch_normalization.hpp"
#include "cohort/nn/layer.hpp"
#include "cohort/nn/padding.hpp"
#include "cohort/tensor/ops.hpp"

namespace cohort::nn {

class Conv2D : public Layer {
 public:
  Conv2D(int filters, int kernel_size, Padding padding = Padding::Valid, int stride = 1, bool use_bias = true);

  std::string type_name() const override { return "Conv2D"; }
  bool capturable() const override { return true; }
  std::string name_stem() const override { return "conv2d"; }
  Shape build(const Shape& input_sample_shape, VariableFactory& factory) override;
  Tensor forward(const Tensor& x, const ForwardContext& context) override;
  Tensor backward(const Tensor& dy, bool need_input_gradient) override;
  // Absorbs an elementwise activation after it (applied as the output is written) and, in inference only, a
  // BatchNormalization before that activation (folded into the kernel and bias). While training, a
  // BatchNormalization right after it normalizes with the batch's mean, which cancels the bias: the next
  // forward() then leaves the bias out (the normalization's moving mean takes it back) and backward() gives it
  // a gradient of exactly zero, its true value, instead of a pass over the output gradient.
  std::size_t absorb(std::span<const std::unique_ptr<Layer>> following, const ForwardContext& context) override;
  std::optional<LayerConfig> config() const override;
  std::int64_t multiply_adds_per_sample() const override;

 private:
  int filters_, kernel_size_, stride_;
  Padding padding_;
  bool use_bias_;
  Conv2dPlan plan_;
  VariablePtr kernel_, bias_;
  // Absorbed by absorb() for the next forward() only (a forward() called directly computes this layer alone),
  // and what that forward() applied, for its backward().
  BatchNormalization *absorbed_normalization_ = nullptr, *folded_ = nullptr;
  BatchNormalization* cancelling_normalization_ = nullptr;  // for the next forward()
  bool bias_cancelled_ = false;                             // in the last forward()
  cohort::Activation absorbed_activation_ = cohort::Activation::Linear, activation_ = cohort::Activation::Linear;
  Tensor input_, output_, input_gradient_, output_gradient_, folded_kernel_, folded_bias_;
  Tensor kernel_in_type_, bias_in_type_;  // the (folded) variables in a 16-bit input's type
  Tensor kernel_used_;                    // the kernel the last forward() convolved with
};

}  // namespace cohort::nn
