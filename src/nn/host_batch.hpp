#pragma once
// Losses and metrics computed on the host: a batch's outputs and targets are small, so on a device they
// are copied to the host (one transfer each way) rather than given kernels of their own.

#include "cohort/core/check.hpp"
#include "cohort/tensor/ops.hpp"
#include "cohort/tensor/tensor.hpp"

namespace cohort::nn {

// What the element-wise losses and metrics take: targets shaped like the prediction, or one value per
// row for one output.
inline void check_elementwise(const char* who, const Tensor& prediction, const Tensor& targets) {
  COHORT_CHECK(prediction.rank() >= 1 && targets.rank() >= 1 && targets.dim(0) == prediction.dim(0) &&
                   targets.numel() == prediction.numel(),
               "{} needs targets shaped like the prediction {}, got {}", who, prediction.shape(), targets.shape());
}

// Outputs per sample of a batch (1 for an empty one), to turn a sum over outputs into one per sample.
inline double outputs_per_sample(const Tensor& prediction) {
  return prediction.dim(0) == 0 ? 1.0 : static_cast<double>(prediction.numel() / prediction.dim(0));
}

// Calls compute(prediction, targets, gradient or nullptr) on host copies, then moves the gradient back.
template <class Compute>
auto on_host(const Tensor& prediction, const Tensor& targets, const Tensor& gradient, Compute compute) {
  const Tensor host_prediction = prediction.to(Device::CPU), host_targets = targets.to(Device::CPU);
  const bool staged_gradient = gradient.defined() && gradient.device() != Device::CPU;
  const Tensor host_gradient = staged_gradient ? Tensor(gradient.shape()) : gradient;
  auto result = compute(static_cast<const float*>(host_prediction.data()), static_cast<const float*>(host_targets.data()),
                        host_gradient.defined() ? host_gradient.data() : nullptr);
  if (staged_gradient) ops::copy(host_gradient, gradient);
  return result;
}

}  // namespace cohort::nn
