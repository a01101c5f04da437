// Losses and metrics for the CPU backend. The categorical ones take class indices of shape (N) or targets of
// shape (N, C), both reduced to "the target weight of class j in row r"; the element-wise ones follow
// loss_rules.hpp, as the CUDA kernels do.
#include <algorithm>
#include <cmath>

#include "cohort/core/check.hpp"
#include "cpu_backend.hpp"
#include "tensor/backend_access.hpp"
#include "tensor/loss_rules.hpp"

namespace cohort::cpu {
namespace {

struct Targets {
  const float* data;
  std::int64_t classes;
  bool sparse;

  float weight(std::int64_t row, std::int64_t j) const {
    if (!sparse) return data[row * classes + j];
    return static_cast<std::int64_t>(data[row]) == j ? 1.0f : 0.0f;
  }
  std::int64_t label(std::int64_t row) const {
    if (sparse) return static_cast<std::int64_t>(data[row]);
    const float* r = data + row * classes;
    return std::max_element(r, r + classes) - r;
  }
};

Targets targets_of(const Tensor& labels, std::int64_t classes) {
  const bool sparse = labels.rank() == 1;
  if (sparse) {
    for (std::int64_t i = 0; i < labels.numel(); ++i) {
      const float v = device_data(labels)[i];
      COHORT_CHECK(v >= 0 && v < static_cast<float>(classes) && v == std::floor(v),
                   "label {} of row {} is not a class index in [0, {})", v, i, classes);
    }
  }
  return {device_data(labels), classes, sparse};
}

// Adds to slot `slot` of `sums` the rows of `scores` for which hit(row, classes, the row's label) holds.
template <class Hit>
void add_hits(const Tensor& scores, const Tensor& labels, const RunningSums& sums, int slot, Hit hit) {
  double* sum = sum_target(sums, slot).sum;
  const std::int64_t rows = scores.dim(0);
  const std::int64_t classes = scores.dim(1);
  const Targets targets = targets_of(labels, classes);
  std::int64_t hits = 0;
  for (std::int64_t r = 0; r < rows; ++r) hits += hit(device_data(scores) + r * classes, classes, targets.label(r)) ? 1 : 0;
  *sum += static_cast<double>(hits);
}

}  // namespace

void CpuBackend::softmax_cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& dlogits,
                                       const RunningSums& sums, int slot) {
  double* sum = sum_target(sums, slot).sum;
  const std::int64_t rows = logits.dim(0);
  const std::int64_t classes = logits.dim(1);
  const Targets targets = targets_of(labels, classes);
  const float* lp = device_data(logits);
  float* gp = dlogits.defined() ? device_data(dlogits) : nullptr;
  const double inverse_rows = rows == 0 ? 0.0 : 1.0 / static_cast<double>(rows);
  double total = 0;
#pragma omp parallel for reduction(+ : total) if (rows * classes > 32768)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = lp + r * classes;
    const float peak = *std::max_element(row, row + classes);
    double normalizer = 0;
    for (std::int64_t j = 0; j < classes; ++j) normalizer += std::exp(static_cast<double>(row[j] - peak));
    const double log_normalizer = std::log(normalizer) + peak;
    double target_mass = 0;
    for (std::int64_t j = 0; j < classes; ++j) {
      const double w = targets.weight(r, j);
      total += w * (log_normalizer - row[j]);
      target_mass += w;
    }
    if (gp != nullptr) {
      // d/dz of -sum_j w_j log softmax_j = softmax * sum_j w_j - w
      for (std::int64_t j = 0; j < classes; ++j) {
        const double p = std::exp(row[j] - log_normalizer);
        gp[r * classes + j] = static_cast<float>((p * target_mass - targets.weight(r, j)) * inverse_rows);
      }
    }
  }
  *sum += total;
}

void CpuBackend::categorical_cross_entropy(const Tensor& probabilities, const Tensor& labels, const Tensor& dprobabilities,
                                           const RunningSums& sums, int slot) {
  double* sum = sum_target(sums, slot).sum;
  constexpr float kEpsilon = 1e-7f;
  const std::int64_t rows = probabilities.dim(0);
  const std::int64_t classes = probabilities.dim(1);
  const Targets targets = targets_of(labels, classes);
  const float* pp = device_data(probabilities);
  float* gp = dprobabilities.defined() ? device_data(dprobabilities) : nullptr;
  const double inverse_rows = rows == 0 ? 0.0 : 1.0 / static_cast<double>(rows);
  double total = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < classes; ++j) {
      const float raw = pp[r * classes + j];
      const float p = std::clamp(raw, kEpsilon, 1.0f - kEpsilon);
      const float w = targets.weight(r, j);
      total -= w * std::log(p);
      if (gp != nullptr) {
        const bool clipped = raw < kEpsilon || raw > 1.0f - kEpsilon;
        gp[r * classes + j] = clipped ? 0.0f : static_cast<float>(-w / p * inverse_rows);
      }
    }
  }
  *sum += total;
}

void CpuBackend::count_correct(const Tensor& scores, const Tensor& labels, const RunningSums& sums, int slot) {
  add_hits(scores, labels, sums, slot, [](const float* row, std::int64_t classes, std::int64_t label) {
    return std::max_element(row, row + classes) - row == label;
  });
}

void CpuBackend::count_top_k(const Tensor& scores, const Tensor& labels, int k, const RunningSums& sums, int slot) {
  add_hits(scores, labels, sums, slot, [k](const float* row, std::int64_t classes, std::int64_t label) {
    // Ties count against the label, as a strict ranking would place it last among equals; a score that is
    // not finite ranks nowhere.
    if (!std::isfinite(row[label])) return false;
    const std::int64_t at_least_as_high = std::count_if(row, row + classes, [&](float v) { return v >= row[label]; });
    return at_least_as_high - 1 < k;
  });
}

void CpuBackend::elementwise_loss(ElementwiseLoss loss, const Tensor& prediction, const Tensor& targets,
                                  const Tensor& gradient, const RunningSums& sums, int slot) {
  double* sum = sum_target(sums, slot).sum;
  const std::int64_t rows = prediction.dim(0);
  if (rows == 0) return;
  const std::int64_t outputs = prediction.numel() / rows;
  const float* p = device_data(prediction);
  const float* z = device_data(targets);
  float* g = gradient.defined() ? device_data(gradient) : nullptr;
  const double inverse_outputs = 1.0 / static_cast<double>(outputs);
  const double inverse_elements = 1.0 / static_cast<double>(prediction.numel());
  double total = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    double row_total = 0;
    for (std::int64_t i = r * outputs; i < (r + 1) * outputs; ++i) {
      double d = 0;
      row_total += loss_rules::elementwise_loss(loss, p[i], z[i], d);
      if (g != nullptr) g[i] = static_cast<float>(d * inverse_elements);
    }
    total += row_total * inverse_outputs;
  }
  *sum += total;
}

}  // namespace cohort::cpu
