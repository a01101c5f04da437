#pragma once
// Elementwise activations as compile-time functions for the CPU loops that apply one in passing (bias,
// batch normalization, convolution outputs): each loop is compiled once per activation instead of
// branching per element.
#include "cohort/core/check.hpp"
#include "cohort/tensor/geometry.hpp"
#include "tensor/activation_rules.hpp"

namespace cohort::cpu {

// Calls body(activate), activate(v) being `activation` of v (v itself for Linear).
template <typename Body>
decltype(auto) with_activation(Activation activation, Body&& body) {
  switch (activation) {
    case Activation::Linear:
      return body([](float v) { return v; });
    case Activation::Relu:
      return body([](float v) { return activation_rules::relu(v); });
    case Activation::Sigmoid:
      return body([](float v) { return activation_rules::sigmoid(v); });
    case Activation::Tanh:
      return body([](float v) { return activation_rules::tanh(v); });
    case Activation::Softmax:
      break;
  }
  throw InvalidArgument(fmt::format("{} is not an elementwise activation", activation_name(activation)));
}

// Calls body(gradient), gradient(y, dy) being dL/d(input) of `activation` from its output y and dL/dy.
template <typename Body>
decltype(auto) with_activation_gradient(Activation activation, Body&& body) {
  switch (activation) {
    case Activation::Linear:
      return body([](float, float dy) { return dy; });
    case Activation::Relu:
      return body([](float y, float dy) { return activation_rules::relu_gradient(y, dy); });
    case Activation::Sigmoid:
      return body([](float y, float dy) { return activation_rules::sigmoid_gradient(y, dy); });
    case Activation::Tanh:
      return body([](float y, float dy) { return activation_rules::tanh_gradient(y, dy); });
    case Activation::Softmax:
      break;
  }
  throw InvalidArgument(fmt::format("{} is not an elementwise activation", activation_name(activation)));
}

}  // namespace cohort::cpu
