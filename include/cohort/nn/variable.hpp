#pragma once
// Variable: a named model tensor with its gradient. Names are stable and human-readable
// ("conv2d_1/kernel", "batch_normalization/moving_mean"); creation order is the order of build().
// Placement, optimizers and checkpoints key on the name.

#include <memory>
#include <string>

#include "cohort/tensor/tensor.hpp"

namespace cohort::nn {

struct Variable {
  std::string name;
  Tensor value;
  Tensor gradient;  // defined for trainable variables only
  bool trainable = true;
  int creation_order = 0;
};

using VariablePtr = std::shared_ptr<Variable>;

}  // namespace cohort::nn
