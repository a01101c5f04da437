#pragma once
// The check that the element-wise losses and metrics make before their op, so that its error names them.

#include <string>

#include "cohort/core/check.hpp"
#include "cohort/tensor/tensor.hpp"

namespace cohort::nn {

// What the element-wise losses and metrics take: targets shaped like the prediction, or one value per
// row for one output.
inline void check_elementwise(const std::string& who, const Tensor& prediction, const Tensor& targets) {
  COHORT_CHECK(prediction.rank() >= 1 && targets.rank() >= 1 && targets.dim(0) == prediction.dim(0) &&
                   targets.numel() == prediction.numel(),
               "{} needs targets shaped like the prediction {}, got {}", who, prediction.shape(), targets.shape());
}

}  // namespace cohort::nn
