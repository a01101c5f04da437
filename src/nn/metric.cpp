#include "cohort/nn/metric.hpp"

#include <charconv>

#include "cohort/core/check.hpp"
#include "cohort/core/error.hpp"
#include "cohort/tensor/ops.hpp"
#include "elementwise_targets.hpp"

namespace cohort::nn {
namespace {

constexpr const char* kKnownNames =
    "accuracy, top_k_accuracy, top_<k>_accuracy, mean_absolute_error (mae), mean_squared_error (mse)";

// "top_3_accuracy" -> 3; 0 when the name has another form.
int top_k_of(const std::string& name) {
  constexpr std::string_view prefix = "top_", suffix = "_accuracy";
  if (name.size() <= prefix.size() + suffix.size() || !name.starts_with(prefix) || !name.ends_with(suffix)) return 0;
  const char* first = name.data() + prefix.size();
  const char* last = name.data() + name.size() - suffix.size();
  int k = 0;
  const auto [end, error] = std::from_chars(first, last, k);
  return error == std::errc() && end == last ? k : 0;
}

}  // namespace

Metric::Metric(Kind kind, int k) : kind_(kind), k_(k) {
  switch (kind) {
    case Kind::Accuracy: name_ = "accuracy"; break;
    case Kind::TopKAccuracy: name_ = fmt::format("top_{}_accuracy", k); break;
    case Kind::MeanAbsoluteError: name_ = "mae"; break;
    case Kind::MeanSquaredError: name_ = "mse"; break;
  }
}

Metric::Metric(const char* name) : Metric(std::string(name)) {}

Metric::Metric(const std::string& name) : Metric(Kind::Accuracy, 0) {
  if (name == "accuracy") return;
  if (name == "top_k_accuracy") {
    *this = top_k_accuracy();
  } else if (const int k = top_k_of(name); k > 0) {
    *this = top_k_accuracy(k);
  } else if (name == "mae" || name == "mean_absolute_error") {
    *this = mean_absolute_error();
  } else if (name == "mse" || name == "mean_squared_error") {
    *this = mean_squared_error();
  } else {
    throw InvalidArgument(fmt::format("unknown metric '{}'; known: {}", name, kKnownNames));
  }
}

Metric Metric::top_k_accuracy(int k) {
  COHORT_CHECK(k >= 1, "top-k accuracy needs k >= 1, got {}", k);
  return Metric(Kind::TopKAccuracy, k);
}

void Metric::check_fits(const Loss& loss, const LossFit& fit) const {
  switch (kind_) {
    case Kind::Accuracy:
      COHORT_CHECK(is_categorical(loss) || std::holds_alternative<BinaryCrossentropy>(loss),
                   "accuracy needs classes, the loss {} is a regression: use mae or mse", loss_name(loss));
      break;
    case Kind::TopKAccuracy:
      COHORT_CHECK(is_categorical(loss), "{} needs a categorical loss, got {}", name_, loss_name(loss));
      COHORT_CHECK(fit.output_shape.rank() == 1 && k_ <= fit.output_shape[0], "{} needs at least {} classes, the model has {}",
                   name_, k_, fit.output_shape);
      break;
    case Kind::MeanAbsoluteError:
    case Kind::MeanSquaredError: check_targets_shaped_like_output(name_, fit); break;
  }
}

double Metric::batch_sum(const Loss& loss, const Tensor& prediction, bool logits, const Tensor& targets) const {
  RunningSums sums(prediction.device(), 1);
  add_batch_sum(loss, prediction, logits, targets, sums, 0);
  return sums.read()[0];
}

void Metric::add_batch_sum(const Loss& loss, const Tensor& prediction, bool logits, const Tensor& targets,
                           RunningSums& sums, int slot) const {
  switch (kind_) {
    case Kind::Accuracy:
      if (!std::holds_alternative<BinaryCrossentropy>(loss)) return ops::count_correct(prediction, targets, sums, slot);
      check_elementwise(name_, prediction, targets);
      return ops::elementwise_loss(logits ? ElementwiseLoss::BinaryHitsOfLogits : ElementwiseLoss::BinaryHits,
                                   prediction, targets, Tensor(), sums, slot);
    case Kind::TopKAccuracy: return ops::count_top_k(prediction, targets, k_, sums, slot);
    case Kind::MeanAbsoluteError:
    case Kind::MeanSquaredError: {
      check_elementwise(name_, prediction, targets);
      const ElementwiseLoss error =
          kind_ == Kind::MeanSquaredError ? ElementwiseLoss::SquaredError : ElementwiseLoss::AbsoluteError;
      // Keras measures the model's output: where the loss took the model's final activation into itself (not
      // from_logits, whose logits are the output), the metric applies it to the logits it is given.
      const auto activation = probability_activation(loss);
      if (!logits || expects_logits(loss) || !activation)
        return ops::elementwise_loss(error, prediction, targets, Tensor(), sums, slot);
      const Tensor output(prediction.shape(), prediction.dtype(), prediction.device());
      ops::activation_forward(*activation, prediction, output);
      return ops::elementwise_loss(error, output, targets, Tensor(), sums, slot);
    }
  }
}

}  // namespace cohort::nn
