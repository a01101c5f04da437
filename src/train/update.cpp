#include "cohort/train/update.hpp"

#include "cohort/core/timeline.hpp"

namespace cohort::train {

void update_variables(optim::Optimizer& optimizer, const std::vector<nn::VariablePtr>& variables) {
  const timeline::Span span("update", "optimizer step");
  std::vector<optim::Optimizer::Gradient> gradients;
  gradients.reserve(variables.size());
  for (const auto& variable : variables)
    if (variable->trainable) gradients.push_back({variable->name, variable->value, variable->gradient});
  optimizer.apply(gradients);  // one op for all: one launch on a GPU
  optimizer.finish_step();
}

}  // namespace cohort::train
