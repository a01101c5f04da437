#include "cohort/train/gradient_accumulator.hpp"

#include "cohort/core/check.hpp"
#include "cohort/tensor/ops.hpp"

namespace cohort::train {

void GradientAccumulator::add(std::span<const nn::VariablePtr> variables, std::int64_t samples) {
  if (samples == 0) return;
  const auto weight = static_cast<float>(samples);
  for (const auto& v : variables) {
    Sum& sum = sums_[v.get()];
    if (sum.holds) {
      ops::axpy(weight, v->gradient, sum.value);
      continue;
    }
    if (!sum.value.defined() || sum.value.shape() != v->gradient.shape() || sum.value.device() != v->gradient.device())
      sum.value = Tensor::uninitialized(v->gradient.shape(), v->gradient.device());
    ops::copy(v->gradient, sum.value);
    ops::scale(sum.value, weight);
    sum.holds = true;
  }
}

void GradientAccumulator::finish(std::span<const nn::VariablePtr> variables, std::int64_t samples, std::int64_t total) {
  COHORT_CHECK(samples >= 0 && samples <= total, "an update of {} samples whose last pass had {}", total, samples);
  for (const auto& v : variables) {
    const auto found = sums_.find(v.get());
    Sum* held = found != sums_.end() && found->second.holds ? &found->second : nullptr;
    if (total == 0) {
      ops::fill(v->gradient, 0.0f);
    } else if (held == nullptr) {
      COHORT_CHECK(samples == total, "no gradients were added for '{}', yet the update holds {} samples besides the last pass's {}",
                   v->name, total - samples, samples);
    } else {
      const float inverse = 1.0f / static_cast<float>(total);
      if (samples == 0) ops::fill(v->gradient, 0.0f);
      else ops::scale(v->gradient, static_cast<float>(samples) * inverse);
      ops::axpy(inverse, held->value, v->gradient);
    }
    if (held != nullptr) held->holds = false;
  }
}

}  // namespace cohort::train
