#include "cohort/nn/batch_normalization.hpp"

#include <utility>

#include "cohort/core/check.hpp"
#include "cohort/nn/activation_layer.hpp"
#include "cohort/tensor/ops.hpp"

namespace cohort::nn {

BatchNormalization::BatchNormalization(BatchNormalizationOptions options) : options_(options) {
  COHORT_CHECK(options.momentum >= 0.0f && options.momentum <= 1.0f, "BatchNormalization momentum {} not in [0, 1]",
               options.momentum);
  COHORT_CHECK(options.epsilon > 0.0f, "BatchNormalization epsilon must be positive, got {}", options.epsilon);
}

Shape BatchNormalization::build(const Shape& in, VariableFactory& factory) {
  COHORT_CHECK(in.rank() >= 1, "{}: BatchNormalization needs samples with a channel axis", name());
  const Shape channels{in[in.rank() - 1]};
  gamma_ = factory.create("gamma", channels, true);
  beta_ = factory.create("beta", channels, true);
  moving_mean_ = factory.create("moving_mean", channels, false);
  moving_variance_ = factory.create("moving_variance", channels, false);
  ops::fill(gamma_->value, 1.0f);
  ops::fill(moving_variance_->value, 1.0f);
  variables_ = {gamma_, beta_, moving_mean_, moving_variance_};
  plan_ = BatchNormPlan({.channels = channels[0], .epsilon = options_.epsilon}, factory.device());
  return in;
}

std::size_t BatchNormalization::absorb(std::span<const std::unique_ptr<Layer>> following,
                                      const ForwardContext& context) {
  absorbed_activation_ = cohort::Activation::Linear;
  // Not in eval mode with a backward() to follow: that backward (constant statistics) stays unfused.
  if (following.empty() || !(context.training || context.inference_only)) return 0;
  const auto activation = elementwise_activation(*following.front());
  if (!activation) return 0;
  absorbed_activation_ = *activation;
  return 1;
}

Tensor BatchNormalization::forward(const Tensor& x, const ForwardContext& context) {
  input_ = x;
  reuse(output_, x.shape(), x);
  used_batch_statistics_ = context.training;
  activation_ = std::exchange(absorbed_activation_, cohort::Activation::Linear);
  const Tensor offset = std::exchange(next_offset_, Tensor());
  if (!context.training) {
    ops::batch_norm_activation_forward_inference(plan_, x, gamma_->value, beta_->value, moving_mean_->value,
                                                 moving_variance_->value, activation_, output_);
    return output_;
  }
  const Shape channels{x.dim(x.rank() - 1)};
  reuse(batch_mean_, channels, x.device());
  reuse(batch_variance_, channels, x.device());
  ops::batch_norm_activation_forward_training(plan_, x, gamma_->value, beta_->value, activation_, output_,
                                              batch_mean_, batch_variance_);
  Tensor mean_with_offset = batch_mean_;
  if (offset.defined()) {
    reuse(offset_mean_, channels, x.device());
    ops::copy(batch_mean_, offset_mean_);
    ops::axpy(1.0f, offset, offset_mean_);
    mean_with_offset = offset_mean_;
  }
  ops::moving_average_update(moving_mean_->value, mean_with_offset, options_.momentum);
  ops::moving_average_update(moving_variance_->value, batch_variance_, options_.momentum);
  return output_;
}

Tensor BatchNormalization::backward(const Tensor& dy, bool need_input_gradient) {
  COHORT_CHECK(input_.defined(), "{}: backward() needs a forward() first", name());
  if (need_input_gradient) reuse(input_gradient_, input_.shape(), input_);
  const Tensor dx = need_input_gradient ? input_gradient_ : Tensor();
  if (!used_batch_statistics_)
    ops::batch_norm_backward_inference(plan_, input_, gamma_->value, dy, moving_mean_->value, moving_variance_->value,
                                       dx, gamma_->gradient, beta_->gradient);
  else if (activation_ != cohort::Activation::Linear)
    ops::batch_norm_activation_backward(plan_, input_, output_, gamma_->value, beta_->value, dy, batch_mean_,
                                        batch_variance_, activation_, dx, gamma_->gradient, beta_->gradient);
  else
    ops::batch_norm_backward(plan_, input_, gamma_->value, dy, batch_mean_, batch_variance_, dx, gamma_->gradient,
                             beta_->gradient);
  return dx;
}

void BatchNormalization::fold(const Tensor& kernel, const Tensor& bias, const Tensor& folded_kernel,
                              const Tensor& folded_bias) {
  // Both through the inference op itself, so that the scale is computed as the unfolded layer computes it:
  // the kernel with zero mean and shift (kernel * s), the bias with the layer's own statistics.
  const std::int64_t channels = gamma_->value.numel();
  reuse(zeros_, {channels}, kernel.device());
  ops::fill(zeros_, 0.0f);
  const std::int64_t rows = kernel.numel() / channels;
  ops::batch_norm_forward_inference(plan_, kernel.view({rows, channels}), gamma_->value, zeros_, zeros_,
                                    moving_variance_->value, folded_kernel.view({rows, channels}));
  ops::batch_norm_forward_inference(plan_, (bias.defined() ? bias : zeros_).view({1, channels}), gamma_->value,
                                    beta_->value, moving_mean_->value, moving_variance_->value,
                                    folded_bias.view({1, channels}));
}

std::optional<LayerConfig> BatchNormalization::config() const {
  return LayerConfig{{"momentum", options_.momentum}, {"epsilon", options_.epsilon}};
}

}  // namespace cohort::nn
