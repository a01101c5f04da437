#pragma once
// Flatten, as keras.layers.Flatten: (N, d1, d2, ...) -> (N, d1 * d2 * ...), a view without a copy.

#include "cohort/nn/layer.hpp"

namespace cohort::nn {

class Flatten : public Layer {
 public:
  std::string type_name() const override { return "Flatten"; }
  bool capturable() const override { return true; }
  std::string name_stem() const override { return "flatten"; }
  Shape build(const Shape& input_sample_shape, VariableFactory& factory) override;
  Tensor forward(const Tensor& x, const ForwardContext& context) override;
  Tensor backward(const Tensor& dy, bool need_input_gradient) override;
  std::optional<LayerConfig> config() const override;

 private:
  Shape input_sample_shape_;
};

}  // namespace cohort::nn
