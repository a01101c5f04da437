#include "cohort/nn/activation_layer.hpp"

#include <typeinfo>

namespace cohort::nn {

ActivationLayer::ActivationLayer(cohort::Activation activation, std::string type_name, std::string name_stem)
    : activation_(activation), type_name_(std::move(type_name)), name_stem_(std::move(name_stem)) {}

Shape ActivationLayer::build(const Shape& in, VariableFactory&) { return in; }

Tensor ActivationLayer::forward(const Tensor& x, const ForwardContext&) {
  reuse(output_, x.shape(), x);
  ops::activation_forward(activation_, x, output_);
  return output_;
}

Tensor ActivationLayer::backward(const Tensor& dy, bool need_input_gradient) {
  if (!need_input_gradient) return Tensor();
  reuse(input_gradient_, dy.shape(), dy);
  ops::activation_backward(activation_, output_, dy, input_gradient_);
  return input_gradient_;
}

std::optional<cohort::Activation> elementwise_activation(const Layer& layer) {
  // The built-in layer itself only: a subclass may compute something else in its forward().
  if (typeid(layer) != typeid(ActivationLayer)) return std::nullopt;
  const auto& activation = static_cast<const ActivationLayer&>(layer);
  if (activation.activation() == cohort::Activation::Softmax) return std::nullopt;
  return activation.activation();
}

std::optional<LayerConfig> ActivationLayer::config() const {
  return LayerConfig{{"activation", static_cast<double>(activation_)}};
}

}  // namespace cohort::nn
