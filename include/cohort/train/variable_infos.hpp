#pragma once
// What placement needs to know about a model's variables (names, shapes, creation order, trainable).
//
//   auto plan = ps::make_plan(train::variable_infos(model), 2, ps::placement::SizeBalanced{},
//                             {.optimizer_slots = optim::Adam().slots_per_variable()});

#include <vector>

#include "cohort/nn/sequential.hpp"
#include "cohort/ps/placement.hpp"

namespace cohort::train {

std::vector<ps::VariableInfo> variable_infos(const nn::Sequential& model);

}  // namespace cohort::train
