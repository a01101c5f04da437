#pragma once
// Activation: an elementwise (or, for softmax, last-axis) nonlinearity, as keras.layers.Activation.
// ReLU(), Sigmoid() and Softmax() build the layers Keras names re_lu and softmax.
//
//   model.add(nn::Activation(cohort::Activation::Relu)).add(nn::Softmax());

#include "cohort/nn/layer.hpp"
#include "cohort/tensor/ops.hpp"

namespace cohort::nn {

class ActivationLayer : public Layer {
 public:
  explicit ActivationLayer(cohort::Activation activation, std::string type_name = "Activation",
                           std::string name_stem = "activation");

  std::string type_name() const override { return type_name_; }
  bool capturable() const override { return true; }
  std::string name_stem() const override { return name_stem_; }
  Shape build(const Shape& input_sample_shape, VariableFactory& factory) override;
  Tensor forward(const Tensor& x, const ForwardContext& context) override;
  Tensor backward(const Tensor& dy, bool need_input_gradient) override;
  std::optional<LayerConfig> config() const override;

  cohort::Activation activation() const { return activation_; }

 private:
  cohort::Activation activation_;
  std::string type_name_, name_stem_;
  Tensor output_, input_gradient_;
};

// The activation of `layer` when it is a built-in elementwise activation layer, which the layer before it may
// apply in passing; nullopt for any other layer (Softmax, subclasses of ActivationLayer included).
std::optional<cohort::Activation> elementwise_activation(const Layer& layer);

inline ActivationLayer Activation(cohort::Activation activation) { return ActivationLayer(activation); }
inline ActivationLayer ReLU() { return ActivationLayer(cohort::Activation::Relu, "ReLU", "re_lu"); }
inline ActivationLayer Sigmoid() { return ActivationLayer(cohort::Activation::Sigmoid, "Sigmoid", "sigmoid"); }
inline ActivationLayer Softmax() { return ActivationLayer(cohort::Activation::Softmax, "Softmax", "softmax"); }

}  // namespace cohort::nn
