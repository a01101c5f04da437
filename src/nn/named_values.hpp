#pragma once
// A model's variables by name, as weights files and checkpoints store them.

#include <string>
#include <utility>
#include <vector>

#include "cohort/nn/sequential.hpp"

namespace cohort::nn {

using NamedValues = std::vector<std::pair<std::string, Tensor>>;

NamedValues named_values(const Sequential& model);
// DataError, naming `what`, unless `values` holds exactly the model's variables with their shapes.
void check_named_values(const Sequential& model, const NamedValues& values, const std::string& what);
// Checks, then copies every value into the model's variable of that name (on the model's device).
void assign_named_values(Sequential& model, const NamedValues& values, const std::string& what);

}  // namespace cohort::nn
