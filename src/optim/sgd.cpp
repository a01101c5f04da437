#include "cohort/optim/sgd.hpp"

#include "cohort/core/check.hpp"
#include "cohort/tensor/ops.hpp"

namespace cohort::optim {

SGD::SGD(SGDOptions options) : Optimizer(options.learning_rate, options.decay), options_(std::move(options)) {
  COHORT_CHECK(options_.momentum >= 0 && options_.momentum < 1, "SGD momentum must be in [0, 1), got {}",
               options_.momentum);
  COHORT_CHECK(!options_.nesterov || options_.momentum > 0, "Nesterov SGD needs momentum > 0");
}

void SGD::update(const std::vector<VariableState>& variables, const Tensor& step_size) {
  std::vector<ops::SgdOperands> operands;
  operands.reserve(variables.size());
  for (const VariableState& v : variables)
    operands.push_back({*v.value, *v.gradient, v.slots->empty() ? Tensor() : v.slots->front()});
  ops::sgd_update(operands, step_size, static_cast<float>(options_.momentum), options_.nesterov,
                  static_cast<float>(options_.weight_decay));
}

}  // namespace cohort::optim
