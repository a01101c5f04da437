#pragma once
// Metrics reported beside the loss, with Keras' names. A metric is computed per batch as a sum over its
// samples, so that a trainer can average it over an epoch and over processes weighted by samples.
//   "accuracy"                    arg-max matches the class (categorical losses); for binary_crossentropy,
//                                 the share of outputs on the right side of 0.5 (of 0 for logits)
//   "top_k_accuracy", "top_3_accuracy"   the class is among the k highest scores (k = 5 by default)
//   "mean_absolute_error" / "mae", "mean_squared_error" / "mse"   per sample, averaged over its outputs (the
//                                 model's outputs, after a final activation the loss takes into itself)
//
//   Trainer trainer(model, optim::Adam(), strategy, {.metrics = {"accuracy", nn::Metric::top_k_accuracy(3)}});

#include <string>

#include "cohort/nn/loss.hpp"

namespace cohort::nn {

class Metric {
 public:
  // One of the names above; anything else is an InvalidArgument listing them.
  Metric(const char* name);  // NOLINT(google-explicit-constructor): {"accuracy"} reads as Keras does
  Metric(const std::string& name);  // NOLINT(google-explicit-constructor)
  static Metric accuracy() { return Metric(Kind::Accuracy, 0); }
  static Metric top_k_accuracy(int k = 5);
  static Metric mean_absolute_error() { return Metric(Kind::MeanAbsoluteError, 0); }
  static Metric mean_squared_error() { return Metric(Kind::MeanSquaredError, 0); }

  // The key in logs and History ("accuracy", "top_3_accuracy", "mae").
  const std::string& name() const { return name_; }

  // Throws InvalidArgument when the metric means nothing for this loss, model and data.
  void check_fits(const Loss& loss, const LossFit& fit) const;
  // Sum over the batch's samples of the metric. `logits`: the prediction lacks its final activation.
  double batch_sum(const Loss& loss, const Tensor& prediction, bool logits, const Tensor& targets) const;
  // Adds that sum to slot `slot` of `sums`, on the sums' device without waiting for it.
  void add_batch_sum(const Loss& loss, const Tensor& prediction, bool logits, const Tensor& targets, RunningSums& sums,
                     int slot) const;

 private:
  enum class Kind { Accuracy, TopKAccuracy, MeanAbsoluteError, MeanSquaredError };
  Metric(Kind kind, int k);

  Kind kind_;
  int k_;
  std::string name_;
};

}  // namespace cohort::nn
