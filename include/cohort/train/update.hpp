#pragma once
// One optimizer step over a list of model variables: each trainable one is updated from its gradient,
// then the optimizer's iteration count advances.
//
//   train::update_variables(adam, model.trainable_variables());

#include <vector>

#include "cohort/nn/variable.hpp"
#include "cohort/optim/optimizer.hpp"

namespace cohort::train {

void update_variables(optim::Optimizer& optimizer, const std::vector<nn::VariablePtr>& variables);

}  // namespace cohort::train
