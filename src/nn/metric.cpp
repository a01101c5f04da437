#include "cohort/nn/metric.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "cohort/core/check.hpp"
#include "cohort/core/error.hpp"
#include "cohort/tensor/ops.hpp"
#include "host_batch.hpp"

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

// Per sample: the number of its outputs that are right, over the outputs per sample.
double binary_hits(const Tensor& prediction, bool logits, const Tensor& targets) {
  const double threshold = logits ? 0.0 : 0.5;
  return on_host(prediction, targets, Tensor(), [&](const float* p, const float* z, float*) {
    std::int64_t hits = 0;
    for (std::int64_t i = 0; i < prediction.numel(); ++i) hits += (p[i] > threshold) == (z[i] > 0.5f) ? 1 : 0;
    return static_cast<double>(hits) / outputs_per_sample(prediction);
  });
}

double top_k_hits(const Tensor& scores, const Tensor& labels, int k) {
  return on_host(scores, labels, Tensor(), [&](const float* s, const float* z, float*) {
    const std::int64_t rows = scores.dim(0), classes = scores.dim(1);
    std::int64_t hits = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* row = s + r * classes;
      const std::int64_t label =
          labels.rank() == 1 ? static_cast<std::int64_t>(z[r]) : std::max_element(z + r * classes, z + (r + 1) * classes) - (z + r * classes);
      COHORT_CHECK(label >= 0 && label < classes, "label {} of row {} is not a class index in [0, {})", label, r, classes);
      // Ties count against the label, as a strict ranking would place it last among equals.
      const std::int64_t better = std::count_if(row, row + classes, [&](float v) { return v >= row[label]; }) - 1;
      hits += better < k ? 1 : 0;
    }
    return static_cast<double>(hits);
  });
}

double regression_sum(const Tensor& prediction, const Tensor& targets, bool squared) {
  check_elementwise(squared ? "mse" : "mae", prediction, targets);
  return on_host(prediction, targets, Tensor(), [&](const float* p, const float* z, float*) {
    double total = 0;
    for (std::int64_t i = 0; i < prediction.numel(); ++i) {
      const double d = static_cast<double>(p[i]) - z[i];
      total += squared ? d * d : std::abs(d);
    }
    return total / outputs_per_sample(prediction);
  });
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
  switch (kind_) {
    case Kind::Accuracy:
      if (std::holds_alternative<BinaryCrossentropy>(loss)) return binary_hits(prediction, logits, targets);
      return static_cast<double>(ops::count_correct(prediction, targets));
    case Kind::TopKAccuracy: return top_k_hits(prediction, targets, k_);
    case Kind::MeanAbsoluteError: return regression_sum(prediction, targets, false);
    case Kind::MeanSquaredError: return regression_sum(prediction, targets, true);
  }
  return 0;
}

void Metric::add_batch_sum(const Loss& loss, const Tensor& prediction, bool logits, const Tensor& targets,
                           RunningSums& sums, int slot) const {
  if (kind_ == Kind::Accuracy && is_categorical(loss)) ops::count_correct(prediction, targets, sums, slot);
  else sums.add(slot, batch_sum(loss, prediction, logits, targets));
}

}  // namespace cohort::nn
