#include "cohort/train/update.hpp"

namespace cohort::train {

void update_variables(optim::Optimizer& optimizer, const std::vector<nn::VariablePtr>& variables) {
  for (const auto& variable : variables)
    if (variable->trainable) optimizer.apply(variable->name, variable->value, variable->gradient);
  optimizer.finish_step();
}

}  // namespace cohort::train
