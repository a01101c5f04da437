#pragma once
// Losses with Keras' names and semantics. Each is a small struct that computes the mean loss over a batch
// and, when asked, dL/dprediction; nn::Loss holds any of them, and the Trainer takes one as an option.
//
// Targets: the categorical losses take class indices of shape (N) (the sparse one only those) or one-hot
// or soft targets (N, C); binary cross-entropy takes 0/1 (or soft) targets shaped like the output, or
// class indices 0/1 for a single output; the regression losses take float targets shaped like the output.
// from_logits: the prediction is the raw score before a softmax (categorical) or sigmoid (binary). When
// a model ends in that activation and the loss expects probabilities, the Trainer runs the model without
// it and computes the loss from the logits (the same value, numerically stable).
//
//   model.add(nn::Dense(3));     // no Softmax: the PyTorch habit
//   Trainer trainer(model, optim::Adam(), strategy, {.loss = nn::SparseCategoricalCrossentropy{.from_logits = true}});
//   double value = nn::CategoricalCrossentropy{.from_logits = true}.compute(logits, labels, dlogits);

#include <optional>
#include <string>
#include <variant>

#include "cohort/tensor/geometry.hpp"
#include "cohort/tensor/running_sums.hpp"
#include "cohort/tensor/tensor.hpp"

namespace cohort::nn {

struct CategoricalCrossentropy {
  bool from_logits = false;
  // Mean loss over the batch; writes dL/dprediction into `gradient` when it is defined.
  double compute(const Tensor& prediction, const Tensor& targets, const Tensor& gradient = Tensor()) const;
};

struct SparseCategoricalCrossentropy {
  bool from_logits = false;
  double compute(const Tensor& prediction, const Tensor& labels, const Tensor& gradient = Tensor()) const;
};

// Mean over every output of -(z log p + (1 - z) log(1 - p)), p clipped to [1e-7, 1 - 1e-7] (Keras).
struct BinaryCrossentropy {
  bool from_logits = false;
  double compute(const Tensor& prediction, const Tensor& targets, const Tensor& gradient = Tensor()) const;
};

struct MeanSquaredError {
  double compute(const Tensor& prediction, const Tensor& targets, const Tensor& gradient = Tensor()) const;
};

struct MeanAbsoluteError {
  double compute(const Tensor& prediction, const Tensor& targets, const Tensor& gradient = Tensor()) const;
};

using Loss = std::variant<CategoricalCrossentropy, SparseCategoricalCrossentropy, BinaryCrossentropy, MeanSquaredError,
                          MeanAbsoluteError>;

// Keras' name of the loss ("categorical_crossentropy", "mean_squared_error", ...).
std::string loss_name(const Loss& loss);
// Whether the loss's targets are classes (accuracy then means "the arg-max is right").
bool is_categorical(const Loss& loss);

// What a loss is checked against before training: the model's output per sample and its last
// activation, and what the data set gives per sample (class indices when target_shape is ()).
struct LossFit {
  Shape output_shape;
  cohort::Activation final_activation = cohort::Activation::Linear;
  Shape target_shape;
  int num_classes = 0;
};

// Throws InvalidArgument, saying what to change, when the loss cannot be computed on this model and
// data: probabilities expected from a model without the activation that makes them (or logits from one
// with it), output and targets of different shapes, class indices where floats are needed.
void check_loss_fits(const Loss& loss, const LossFit& fit);

// Whether the loss was told that predictions are logits (from_logits).
bool expects_logits(const Loss& loss);
// The activation that turns the loss's logits into the probabilities it expects (Softmax for the categorical
// losses, Sigmoid for binary cross-entropy); none for the regressions.
std::optional<cohort::Activation> probability_activation(const Loss& loss);
// InvalidArgument naming `who` unless the data set's targets are shaped like the model's output (or are
// one value per sample for a single output): what the element-wise losses and metrics need.
void check_targets_shaped_like_output(const std::string& who, const LossFit& fit);
// True when the model should run without its final activation, which the loss then applies itself.
bool fuses_final_activation(const Loss& loss, cohort::Activation final_activation);

// Mean loss over the batch. `logits` says whether `prediction` lacks the final activation (because the
// loss asked for logits or fused it); writes dL/dprediction into `gradient` when it is defined.
double compute_loss(const Loss& loss, const Tensor& prediction, bool logits, const Tensor& targets,
                    const Tensor& gradient = Tensor());

// Adds the batch's summed loss (its mean times the rows) to slot `slot` of `sums`, which must be on the
// prediction's device, without waiting for it. Writes dL/dprediction into `gradient` when it is defined, as
// compute_loss does.
void add_loss(const Loss& loss, const Tensor& prediction, bool logits, const Tensor& targets, RunningSums& sums, int slot,
              const Tensor& gradient = Tensor());

// Fraction of rows whose arg-max matches the label.
double accuracy(const Tensor& scores, const Tensor& labels);

}  // namespace cohort::nn
