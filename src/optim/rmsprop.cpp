#include "cohort/optim/rmsprop.hpp"

#include "cohort/core/check.hpp"
#include "cohort/tensor/ops.hpp"

namespace cohort::optim {

RMSprop::RMSprop(RMSpropOptions options) : Optimizer(options.learning_rate, options.decay), options_(std::move(options)) {
  COHORT_CHECK(options_.rho >= 0 && options_.rho < 1, "RMSprop rho must be in [0, 1), got {}", options_.rho);
  COHORT_CHECK(options_.momentum >= 0 && options_.momentum < 1, "RMSprop momentum must be in [0, 1)");
}

void RMSprop::update(const std::vector<VariableState>& variables, const Tensor& step_size) {
  std::vector<ops::RmspropOperands> operands;
  operands.reserve(variables.size());
  for (const VariableState& v : variables) {
    // Slot order: mean_square, then mean_gradient when centered, then velocity when momentum > 0.
    const std::vector<Tensor>& slots = *v.slots;
    std::size_t next = 1;
    const Tensor mean_gradient = options_.centered ? slots[next++] : Tensor();
    const Tensor velocity = options_.momentum > 0 ? slots[next++] : Tensor();
    operands.push_back({*v.value, *v.gradient, slots[0], mean_gradient, velocity});
  }
  ops::rmsprop_update(operands, step_size, static_cast<float>(options_.rho),
                      static_cast<float>(options_.momentum), static_cast<float>(options_.epsilon),
                      static_cast<float>(options_.weight_decay));
}

}  // namespace cohort::optim
