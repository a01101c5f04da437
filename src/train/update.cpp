#include "cohort/train/update.hpp"

#include <cmath>

#include "cohort/core/timeline.hpp"
#include "cohort/tensor/ops.hpp"

namespace cohort::train {

bool update_variables(optim::Optimizer& optimizer, const std::vector<nn::VariablePtr>& variables, LossScale* loss_scale) {
  const timeline::Span span("update", "optimizer step");
  std::vector<optim::Optimizer::Gradient> gradients;
  gradients.reserve(variables.size());
  for (const auto& variable : variables)
    if (variable->trainable) gradients.push_back({variable->name, variable->value, variable->gradient});
  if (loss_scale != nullptr) {
    std::vector<Tensor> scaled;
    for (const auto& g : gradients) scaled.push_back(g.gradient);
    const std::optional<std::size_t> not_finite = unscale_gradients(scaled, *loss_scale);
    loss_scale->record(!not_finite, not_finite ? gradients[*not_finite].name : std::string());
    if (not_finite) return false;
  }
  optimizer.apply(gradients);  // one op for all: one launch on a GPU
  optimizer.finish_step();
  return true;
}

std::optional<std::size_t> unscale_gradients(const std::vector<Tensor>& gradients, const LossScale& loss_scale) {
  std::optional<std::size_t> first_not_finite;
  for (std::size_t i = 0; i < gradients.size(); ++i) {
    ops::scale(gradients[i], 1.0f / loss_scale.value());
    // A sum of squares in double is finite exactly when every float gradient is.
    if (!first_not_finite && !std::isfinite(ops::sum_of_squares(gradients[i]))) first_not_finite = i;
  }
  return first_not_finite;
}

}  // namespace cohort::train
