#pragma once
// BatchNormalization over the last axis, as keras.layers.BatchNormalization: momentum 0.99,
// epsilon 1e-3. Training normalizes with the batch mean and (biased) variance and updates the moving
// statistics; inference uses the moving statistics.
// Variables: gamma (ones), beta (zeros) trainable; moving_mean (zeros), moving_variance (ones) not.
//
//   model.add(nn::BatchNormalization());

#include "cohort/nn/layer.hpp"
#include "cohort/tensor/ops.hpp"

namespace cohort::nn {

struct BatchNormalizationOptions {
  float momentum = 0.99f;
  float epsilon = 1e-3f;
};

class BatchNormalization : public Layer {
 public:
  explicit BatchNormalization(BatchNormalizationOptions options = {});

  std::string type_name() const override { return "BatchNormalization"; }
  bool capturable() const override { return true; }
  std::string name_stem() const override { return "batch_normalization"; }
  Shape build(const Shape& input_sample_shape, VariableFactory& factory) override;
  Tensor forward(const Tensor& x, const ForwardContext& context) override;
  Tensor backward(const Tensor& dy, bool need_input_gradient) override;
  // Absorbs an elementwise activation after it while training and in inference: one pass instead of two.
  std::size_t absorb(std::span<const std::unique_ptr<Layer>> following, const ForwardContext& context) override;
  std::optional<LayerConfig> config() const override;

  const BatchNormalizationOptions& options() const { return options_; }

  // Folds this layer's inference into the layer before it, whose output channels are the last axis of
  // `kernel` and of `bias` (undefined: none): kernel' = kernel * s, bias' = (bias - moving_mean) * s + beta,
  // with s = gamma / sqrt(moving_variance + epsilon).
  void fold(const Tensor& kernel, const Tensor& bias, const Tensor& folded_kernel, const Tensor& folded_bias);
  // The layer before left out a per-channel `offset` (a bias) that normalizing with the batch's statistics
  // cancels: the next forward() in training adds it to the batch mean it takes into the moving mean, which
  // then tracks the mean of the input with the offset, as it would have been.
  void offset_next_batch_mean(const Tensor& offset) { next_offset_ = offset; }

 protected:
  BatchNormalizationOptions options_;
  bool used_batch_statistics_ = false;
  // Absorbed by absorb() for the next forward() only (a forward() called directly computes this layer alone),
  // and what that forward() applied, for its backward().
  cohort::Activation absorbed_activation_ = cohort::Activation::Linear, activation_ = cohort::Activation::Linear;
  BatchNormPlan plan_;
  VariablePtr gamma_, beta_, moving_mean_, moving_variance_;
  Tensor input_, output_, input_gradient_, batch_mean_, batch_variance_, zeros_;
  Tensor next_offset_, offset_mean_;
};

}  // namespace cohort::nn
