#include "cohort/optim/adam.hpp"

#include <cmath>

#include "cohort/core/check.hpp"
#include "cohort/tensor/ops.hpp"

namespace cohort::optim {

Adam::Adam(AdamOptions options) : Optimizer(options.learning_rate, options.decay), options_(std::move(options)) {
  COHORT_CHECK(options_.beta_1 >= 0 && options_.beta_1 < 1 && options_.beta_2 >= 0 && options_.beta_2 < 1,
               "Adam betas must be in [0, 1), got {} and {}", options_.beta_1, options_.beta_2);
  COHORT_CHECK(options_.epsilon > 0, "Adam epsilon must be positive");
}

double Adam::step_size(double learning_rate) const {
  const double t = static_cast<double>(iterations() + 1);
  return learning_rate * std::sqrt(1.0 - std::pow(options_.beta_2, t)) / (1.0 - std::pow(options_.beta_1, t));
}

void Adam::update(const std::vector<VariableState>& variables, const Tensor& step_size) {
  std::vector<ops::AdamOperands> operands;
  operands.reserve(variables.size());
  for (const VariableState& v : variables) operands.push_back({*v.value, *v.gradient, (*v.slots)[0], (*v.slots)[1]});
  ops::adam_update(operands, step_size, static_cast<float>(options_.beta_1), static_cast<float>(options_.beta_2),
                   static_cast<float>(options_.epsilon), static_cast<float>(options_.weight_decay));
}

}  // namespace cohort::optim
