#include "cohort/nn/sync_batch_normalization.hpp"

#include <utility>

#include "cohort/core/check.hpp"
#include "cohort/nn/replica_sum.hpp"
#include "cohort/tensor/ops.hpp"

namespace cohort::nn {

// Backward over the global batch of R values per channel, with this replica's r of them. The loss each
// replica back-propagates is the mean over its own samples, and the strategy weights the replicas'
// gradients by r / R; in those units
//   dx = gamma / sigma * (dy - a - xhat * b),  a = sum_replicas(r * sum(dy)) / (R r),  b = the same of dy * xhat,
// which for one replica is BatchNormalization's backward. The per-channel terms are computed by the
// inference op on (1, channels) rows: gamma * (v - 0) / sigma + 0 for each coefficient vector v.

std::int64_t SyncBatchNormalization::replica_sum_elements() const { return 2 * channels() + 1; }

std::size_t SyncBatchNormalization::absorb(std::span<const std::unique_ptr<Layer>> following,
                                          const ForwardContext& context) {
  if (context.training && context.replica_sum != nullptr) return 0;
  return BatchNormalization::absorb(following, context);
}

void SyncBatchNormalization::prepare_buffers(Device device) {
  const std::int64_t c = channels();
  for (Tensor* t : {&batch_mean_, &batch_variance_, &squares_, &scale_, &shift_}) reuse(*t, {c}, device);
  reuse(moments_, {2 * c + 1}, device);
  reuse(gradient_sums_, {2 * c}, device);
}

void SyncBatchNormalization::adopt_global_statistics() {
  const std::int64_t c = channels();
  global_rows_ = ops::sum(moments_.slice(2 * c, 2 * c + 1));
  if (global_rows_ <= 0) return;  // no replica had a sample: nothing moves
  const auto inverse = static_cast<float>(1.0 / global_rows_);
  ops::copy(moments_.slice(0, c), batch_mean_);
  ops::scale(batch_mean_, inverse);
  // E[x^2] - E[x]^2, biased, as BatchNormalization's batch variance.
  ops::copy(moments_.slice(c, 2 * c), batch_variance_);
  ops::scale(batch_variance_, inverse);
  ops::multiply(batch_mean_, batch_mean_, squares_);
  ops::axpy(-1.0f, squares_, batch_variance_);
  ops::moving_average_update(moving_mean_->value, batch_mean_, options_.momentum);
  ops::moving_average_update(moving_variance_->value, batch_variance_, options_.momentum);
}

Tensor SyncBatchNormalization::forward(const Tensor& x, const ForwardContext& context) {
  replica_sum_ = context.training ? context.replica_sum : nullptr;
  if (replica_sum_ == nullptr) return BatchNormalization::forward(x, context);
  COHORT_CHECK(absorbed_activation_ == cohort::Activation::Linear, "{}: absorbed a layer while summing over replicas", name());
  input_ = x;
  reuse(output_, x.shape(), x);
  used_batch_statistics_ = true;
  activation_ = cohort::Activation::Linear;
  const std::int64_t c = channels();
  prepare_buffers(x.device());
  // This replica's moments from its own mean and variance: sum = r m, sum of squares = r (v + m^2).
  ops::batch_norm_forward_training(plan_, x, gamma_->value, beta_->value, output_, batch_mean_, batch_variance_);
  local_rows_ = static_cast<double>(x.numel() / c);
  const auto rows = static_cast<float>(local_rows_);
  ops::copy(batch_mean_, moments_.slice(0, c));
  ops::scale(moments_.slice(0, c), rows);
  ops::multiply(batch_mean_, batch_mean_, squares_);
  ops::axpy(1.0f, batch_variance_, squares_);
  ops::copy(squares_, moments_.slice(c, 2 * c));
  ops::scale(moments_.slice(c, 2 * c), rows);
  ops::fill(moments_.slice(2 * c, 2 * c + 1), rows);
  replica_sum_->sum(moments_);
  adopt_global_statistics();
  ops::batch_norm_forward_inference(plan_, x, gamma_->value, beta_->value, batch_mean_, batch_variance_, output_);
  return output_;
}

void SyncBatchNormalization::forward_without_batch(const ForwardContext& context) {
  replica_sum_ = context.training ? context.replica_sum : nullptr;
  if (replica_sum_ == nullptr) return;
  prepare_buffers(gamma_->value.device());
  local_rows_ = 0;
  ops::fill(moments_, 0.0f);
  replica_sum_->sum(moments_);
  adopt_global_statistics();
}

Tensor SyncBatchNormalization::backward(const Tensor& dy, bool need_input_gradient) {
  if (replica_sum_ == nullptr) return BatchNormalization::backward(dy, need_input_gradient);
  COHORT_CHECK(input_.defined(), "{}: backward() needs a forward() first", name());
  const std::int64_t c = channels();
  if (need_input_gradient) reuse(input_gradient_, input_.shape(), input_);
  const Tensor dx = need_input_gradient ? input_gradient_ : Tensor();
  // dx = gamma / sigma * dy; gamma's and beta's gradients: this replica's sums of dy * xhat and dy.
  ops::batch_norm_backward_inference(plan_, input_, gamma_->value, dy, batch_mean_, batch_variance_, dx,
                                     gamma_->gradient, beta_->gradient);
  const auto rows = static_cast<float>(local_rows_);
  ops::copy(beta_->gradient, gradient_sums_.slice(0, c));
  ops::copy(gamma_->gradient, gradient_sums_.slice(c, 2 * c));
  ops::scale(gradient_sums_, rows);
  replica_sum_->sum(gradient_sums_);
  if (!need_input_gradient) return dx;
  ops::scale(gradient_sums_, static_cast<float>(1.0 / (global_rows_ * local_rows_)));
  // scale_ = -gamma b / sigma, shift_ = -gamma a / sigma; dx += xhat * scale_ + shift_.
  ops::fill(squares_, 0.0f);
  const auto coefficient = [&](const Tensor& v, const Tensor& out) {
    ops::batch_norm_forward_inference(plan_, v.view({1, c}), gamma_->value, squares_, squares_, batch_variance_,
                                      out.view({1, c}));
    ops::scale(out, -1.0f);
  };
  coefficient(gradient_sums_.slice(c, 2 * c), scale_);
  coefficient(gradient_sums_.slice(0, c), shift_);
  reuse(correction_, input_.shape(), input_);
  ops::batch_norm_forward_inference(plan_, input_, scale_, shift_, batch_mean_, batch_variance_, correction_);
  ops::axpy(1.0f, correction_, dx);
  return dx;
}

void SyncBatchNormalization::backward_without_batch() {
  if (replica_sum_ == nullptr) return;
  ops::fill(gradient_sums_, 0.0f);
  replica_sum_->sum(gradient_sums_);
}

}  // namespace cohort::nn
