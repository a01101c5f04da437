#pragma once
// Dropout, as keras.layers.Dropout: in training, zeroes each element with probability `rate` and scales
// the rest by 1 / (1 - rate); in inference it is the identity. Masks are a pure function of the model
// seed, the layer and the training step, so runs are reproducible.
//
//   model.add(nn::Dropout(0.5));

#include "cohort/nn/layer.hpp"

namespace cohort::nn {

class Dropout : public Layer {
 public:
  explicit Dropout(float rate);

  std::string type_name() const override { return "Dropout"; }
  bool capturable() const override { return true; }
  std::string name_stem() const override { return "dropout"; }
  Shape build(const Shape& input_sample_shape, VariableFactory& factory) override;
  Tensor forward(const Tensor& x, const ForwardContext& context) override;
  Tensor backward(const Tensor& dy, bool need_input_gradient) override;
  std::optional<LayerConfig> config() const override;
  bool draws_each_step() const override { return rate_ > 0.0f; }

 private:
  float rate_;
  std::uint64_t seed_ = 0;
  bool active_ = false;
  Tensor mask_, output_, input_gradient_;
};

}  // namespace cohort::nn
