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
    std::string culprit;
    for (const auto& g : gradients) {
      ops::scale(g.gradient, 1.0f / loss_scale->value());
      // A sum of squares in double is finite exactly when every float gradient is.
      if (culprit.empty() && !std::isfinite(ops::sum_of_squares(g.gradient))) culprit = g.name;
    }
    loss_scale->record(culprit.empty(), culprit);
    if (!culprit.empty()) return false;
  }
  optimizer.apply(gradients);  // one op for all: one launch on a GPU
  optimizer.finish_step();
  return true;
}

}  // namespace cohort::train
