#include "cohort/nn/loss.hpp"

#include <optional>

#include "cohort/core/check.hpp"
#include "cohort/core/error.hpp"
#include "cohort/tensor/ops.hpp"
#include "elementwise_targets.hpp"

namespace cohort::nn {
namespace {

// The element-wise kind of a loss that is not categorical; `logits`: the prediction lacks its final activation.
ElementwiseLoss elementwise_kind(const Loss& loss, bool logits) {
  if (std::holds_alternative<MeanSquaredError>(loss)) return ElementwiseLoss::SquaredError;
  if (std::holds_alternative<MeanAbsoluteError>(loss)) return ElementwiseLoss::AbsoluteError;
  return logits ? ElementwiseLoss::BinaryCrossEntropyOfLogits : ElementwiseLoss::BinaryCrossEntropy;
}

double mean_over_elements(const Loss& loss, bool logits, const Tensor& prediction, const Tensor& targets,
                          const Tensor& gradient) {
  check_elementwise(loss_name(loss), prediction, targets);
  return ops::elementwise_loss(elementwise_kind(loss, logits), prediction, targets, gradient);
}

void check_class_indices(const Tensor& labels) {
  COHORT_CHECK(labels.rank() == 1, "sparse_categorical_crossentropy takes class indices of shape (N), got {}",
               labels.shape());
}

std::string last_layer_phrase(const LossFit& fit) {
  return fit.final_activation == cohort::Activation::Linear ? "no final activation" : std::string("a final ") + activation_name(fit.final_activation);
}

void check_probabilities(const std::string& name, const LossFit& fit, cohort::Activation needed, bool from_logits) {
  const bool has_it = fit.final_activation == needed;
  const std::string activation = activation_name(needed);
  if (from_logits && has_it)
    throw InvalidArgument(fmt::format("{} was given from_logits = true, but the model ends in {}: its outputs are "
                                      "probabilities; remove the {} layer or set from_logits = false",
                                      name, activation, activation));
  if (!from_logits && !has_it)
    throw InvalidArgument(fmt::format("{} expects probabilities, but the model has {}: add nn::{}() as the last layer "
                                      "or set from_logits = true",
                                      name, last_layer_phrase(fit), activation));
}

void check_class_targets(const std::string& name, const LossFit& fit, bool soft_targets_allowed) {
  COHORT_CHECK(fit.output_shape.rank() == 1, "{} needs one score per class, the model outputs {} per sample", name,
               fit.output_shape);
  if (fit.target_shape.rank() == 0) {
    COHORT_CHECK(fit.output_shape[0] == fit.num_classes, "the model outputs {} scores per sample, the data set has {} classes",
                 fit.output_shape[0], fit.num_classes);
    return;
  }
  // One value per sample is a class index in a float (Keras takes labels shaped (N, 1)); ours come as integers.
  COHORT_CHECK(soft_targets_allowed || fit.target_shape != Shape{1},
               "{} takes class indices, the data set gives one float target per sample (shape (1)): give the labels as "
               "integers (data::TensorDataset(samples, std::vector<int> labels, classes))", name);
  COHORT_CHECK(soft_targets_allowed, "{} takes class indices, the data set gives targets of shape {}: use "
               "categorical_crossentropy for one-hot targets", name, fit.target_shape);
  COHORT_CHECK(fit.target_shape == fit.output_shape, "the data set's targets {} and the model's outputs {} differ in shape",
               fit.target_shape, fit.output_shape);
}

}  // namespace

void check_targets_shaped_like_output(const std::string& name, const LossFit& fit) {
  const bool one_value = fit.target_shape.rank() == 0 && fit.output_shape == Shape{1};
  COHORT_CHECK(one_value || fit.target_shape == fit.output_shape,
               "{} needs targets shaped like the model's output {}, the data set gives {} per sample", name,
               fit.output_shape, fit.target_shape.rank() == 0 ? std::string("a class index") : fit.target_shape.to_string());
}

double CategoricalCrossentropy::compute(const Tensor& prediction, const Tensor& targets, const Tensor& gradient) const {
  return from_logits ? ops::softmax_cross_entropy(prediction, targets, gradient)
                     : ops::categorical_cross_entropy(prediction, targets, gradient);
}

double SparseCategoricalCrossentropy::compute(const Tensor& prediction, const Tensor& labels, const Tensor& gradient) const {
  check_class_indices(labels);
  return CategoricalCrossentropy{.from_logits = from_logits}.compute(prediction, labels, gradient);
}

double BinaryCrossentropy::compute(const Tensor& prediction, const Tensor& targets, const Tensor& gradient) const {
  return mean_over_elements(*this, from_logits, prediction, targets, gradient);
}

double MeanSquaredError::compute(const Tensor& prediction, const Tensor& targets, const Tensor& gradient) const {
  return mean_over_elements(*this, false, prediction, targets, gradient);
}

double MeanAbsoluteError::compute(const Tensor& prediction, const Tensor& targets, const Tensor& gradient) const {
  return mean_over_elements(*this, false, prediction, targets, gradient);
}

std::string loss_name(const Loss& loss) {
  struct Names {
    std::string operator()(const CategoricalCrossentropy&) const { return "categorical_crossentropy"; }
    std::string operator()(const SparseCategoricalCrossentropy&) const { return "sparse_categorical_crossentropy"; }
    std::string operator()(const BinaryCrossentropy&) const { return "binary_crossentropy"; }
    std::string operator()(const MeanSquaredError&) const { return "mean_squared_error"; }
    std::string operator()(const MeanAbsoluteError&) const { return "mean_absolute_error"; }
  };
  return std::visit(Names{}, loss);
}

bool is_categorical(const Loss& loss) {
  return std::holds_alternative<CategoricalCrossentropy>(loss) || std::holds_alternative<SparseCategoricalCrossentropy>(loss);
}

std::optional<cohort::Activation> probability_activation(const Loss& loss) {
  if (is_categorical(loss)) return cohort::Activation::Softmax;
  if (std::holds_alternative<BinaryCrossentropy>(loss)) return cohort::Activation::Sigmoid;
  return std::nullopt;
}

void check_loss_fits(const Loss& loss, const LossFit& fit) {
  const std::string name = loss_name(loss);
  if (is_categorical(loss)) {
    check_class_targets(name, fit, std::holds_alternative<CategoricalCrossentropy>(loss));
  } else {
    COHORT_CHECK(!std::holds_alternative<BinaryCrossentropy>(loss) || fit.target_shape.rank() > 0 || fit.num_classes == 2,
                 "binary_crossentropy on class indices needs 2 classes, the data set has {}: for one of {} classes per "
                 "sample use sparse_categorical_crossentropy (nn::SparseCategoricalCrossentropy) over {} outputs",
                 fit.num_classes, fit.num_classes, fit.num_classes);
    check_targets_shaped_like_output(name, fit);
  }
  if (const auto needed = probability_activation(loss)) check_probabilities(name, fit, *needed, expects_logits(loss));
}

bool expects_logits(const Loss& loss) {
  return std::visit(
      [](const auto& l) {
        if constexpr (requires { l.from_logits; }) return l.from_logits;
        else return false;
      },
      loss);
}

bool fuses_final_activation(const Loss& loss, cohort::Activation final_activation) {
  return !expects_logits(loss) && probability_activation(loss) == final_activation;
}

double compute_loss(const Loss& loss, const Tensor& prediction, bool logits, const Tensor& targets, const Tensor& gradient) {
  return std::visit(
      [&](auto l) {
        if constexpr (requires { l.from_logits; }) l.from_logits = logits;
        return l.compute(prediction, targets, gradient);
      },
      loss);
}

void add_loss(const Loss& loss, const Tensor& prediction, bool logits, const Tensor& targets, RunningSums& sums, int slot,
              const Tensor& gradient) {
  if (!is_categorical(loss)) {
    check_elementwise(loss_name(loss), prediction, targets);
    ops::elementwise_loss(elementwise_kind(loss, logits), prediction, targets, gradient, sums, slot);
    return;
  }
  if (std::holds_alternative<SparseCategoricalCrossentropy>(loss)) check_class_indices(targets);
  if (logits) ops::softmax_cross_entropy(prediction, targets, gradient, sums, slot);
  else ops::categorical_cross_entropy(prediction, targets, gradient, sums, slot);
}

double accuracy(const Tensor& scores, const Tensor& labels) {
  COHORT_CHECK(scores.rank() == 2 && scores.dim(0) > 0, "accuracy needs a non-empty (N, C) batch, got {}",
               scores.shape());
  return static_cast<double>(ops::count_correct(scores, labels)) / static_cast<double>(scores.dim(0));
}

}  // namespace cohort::nn
