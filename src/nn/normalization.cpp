#include "cohort/nn/normalization.hpp"

#include <cmath>

#include "cohort/core/check.hpp"

namespace cohort::nn {
namespace {

constexpr float kEpsilon = 1e-5f;  // the smallest cuDNN takes

}  // namespace

Normalization::Normalization(std::vector<float> mean, std::vector<float> stddev)
    : mean_(std::move(mean)), stddev_(std::move(stddev)) {
  COHORT_CHECK(!mean_.empty() && mean_.size() == stddev_.size(), "Normalization needs as many means as deviations, got {} and {}",
               mean_.size(), stddev_.size());
  for (std::size_t c = 0; c < stddev_.size(); ++c)
    COHORT_CHECK(std::isfinite(mean_[c]) && std::isfinite(stddev_[c]) && stddev_[c] > 0,
                 "Normalization: channel {} has mean {} and standard deviation {}", c, mean_[c], stddev_[c]);
}

Shape Normalization::build(const Shape& in, VariableFactory& factory) {
  COHORT_CHECK(in.rank() >= 1 && in[in.rank() - 1] == static_cast<std::int64_t>(mean_.size()),
               "{}: {} channel statistics for samples of shape {}", name(), mean_.size(), in);
  const Shape channels{static_cast<std::int64_t>(mean_.size())};
  mean_variable_ = factory.create("mean", channels, false);
  scale_ = factory.create("scale", channels, false);
  std::vector<float> scale(stddev_.size());
  for (std::size_t c = 0; c < scale.size(); ++c) scale[c] = 1.0f / stddev_[c];
  ops::copy(Tensor::from_values(channels, mean_), mean_variable_->value);
  ops::copy(Tensor::from_values(channels, scale), scale_->value);
  variables_ = {mean_variable_, scale_};
  const Device device = factory.device();
  zeros_ = Tensor(channels, device);
  unit_variance_ = Tensor(channels, device);
  ops::fill(unit_variance_, 1.0f - kEpsilon);
  scratch_gamma_ = Tensor(channels, device);
  scratch_beta_ = Tensor(channels, device);
  plan_ = BatchNormPlan({.channels = channels[0], .epsilon = kEpsilon}, device);
  return in;
}

Tensor Normalization::forward(const Tensor& x, const ForwardContext&) {
  input_ = x;
  reuse(output_, x.shape(), x);
  ops::batch_norm_forward_inference(plan_, x, scale_->value, zeros_, mean_variable_->value, unit_variance_, output_);
  return output_;
}

Tensor Normalization::backward(const Tensor& dy, bool need_input_gradient) {
  if (!need_input_gradient) return Tensor();
  reuse(input_gradient_, dy.shape(), dy);
  ops::batch_norm_backward_inference(plan_, input_, scale_->value, dy, mean_variable_->value, unit_variance_, input_gradient_,
                                     scratch_gamma_, scratch_beta_);
  return input_gradient_;
}

std::optional<LayerConfig> Normalization::config() const {
  // The statistics travel as the layer's variables; the config only sizes it.
  return LayerConfig{{"channels", static_cast<double>(mean_.size())}};
}

}  // namespace cohort::nn
