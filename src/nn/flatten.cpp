#include "cohort/nn/flatten.hpp"

namespace cohort::nn {

Shape Flatten::build(const Shape& in, VariableFactory&) {
  input_sample_shape_ = in;
  return {in.numel()};
}

Tensor Flatten::forward(const Tensor& x, const ForwardContext&) {
  return x.view({x.dim(0), input_sample_shape_.numel()});
}

Tensor Flatten::backward(const Tensor& dy, bool need_input_gradient) {
  if (!need_input_gradient) return Tensor();
  return dy.view(input_sample_shape_.batched(dy.dim(0)));
}

std::optional<LayerConfig> Flatten::config() const { return LayerConfig{}; }

}  // namespace cohort::nn
