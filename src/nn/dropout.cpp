#include "cohort/nn/dropout.hpp"

#include "cohort/core/check.hpp"
#include "cohort/core/seed.hpp"
#include "cohort/tensor/ops.hpp"

namespace cohort::nn {

Dropout::Dropout(float rate) : rate_(rate) {
  COHORT_CHECK(rate >= 0.0f && rate < 1.0f, "Dropout rate must be in [0, 1), got {}", rate);
}

Shape Dropout::build(const Shape& in, VariableFactory& factory) {
  seed_ = factory.seed_for("mask");
  return in;
}

Tensor Dropout::forward(const Tensor& x, const ForwardContext& context) {
  active_ = context.training && rate_ > 0.0f;
  if (!active_) return x;
  reuse(mask_, x.shape(), x);
  reuse(output_, x.shape(), x);
  if (context.step_counter != nullptr) ops::dropout_mask(mask_, rate_, seed_, *context.step_counter);
  else ops::dropout_mask(mask_, rate_, derive_seed(seed_, context.step));
  ops::multiply(x, mask_, output_);
  return output_;
}

Tensor Dropout::backward(const Tensor& dy, bool need_input_gradient) {
  if (!need_input_gradient) return Tensor();
  if (!active_) return dy;
  reuse(input_gradient_, dy.shape(), dy);
  ops::multiply(dy, mask_, input_gradient_);
  return input_gradient_;
}

std::optional<LayerConfig> Dropout::config() const { return LayerConfig{{"rate", rate_}}; }

}  // namespace cohort::nn
