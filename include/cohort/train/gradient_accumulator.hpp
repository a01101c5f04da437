#pragma once
// GradientAccumulator: k backward passes, then one update that equals one step over all their samples.
// Each pass's gradients are the mean over its samples; the accumulator keeps their sum weighted by the
// samples, and the last pass turns the gradients into the mean over every sample of the update, so that
// k micro-batches of B are one batch of k x B (uneven micro-batches weighted exactly).
//
//   accumulator.add(variables, samples);                 // after each backward pass but the last
//   accumulator.finish(variables, samples, total);       // per layer during the last one

#include <cstdint>
#include <map>
#include <span>

#include "cohort/nn/variable.hpp"

namespace cohort::train {

class GradientAccumulator {
 public:
  // Adds the variables' gradients, means over `samples` samples, to the sum kept for them.
  void add(std::span<const nn::VariablePtr> variables, std::int64_t samples);
  // Makes each variable's gradient, the mean over its last `samples` samples, the mean over `total`:
  // those and every sample added since the last finish(). Then forgets what it held for them.
  void finish(std::span<const nn::VariablePtr> variables, std::int64_t samples, std::int64_t total);

 private:
  // Per variable, the sum of (samples x gradient) since the last finish(), when `holds`; the buffer is
  // kept across updates.
  struct Sum {
    Tensor value;
    bool holds = false;
  };
  std::map<const nn::Variable*, Sum> sums_;
};

}  // namespace cohort::train
