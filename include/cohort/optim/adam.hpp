#pragma once
// Adam with Keras defaults: learning rate 1e-3, beta_1 0.9, beta_2 0.999, epsilon 1e-7. Bias
// correction is folded into the step size: lr_t = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t).
//
//   optim::Adam adam;   // Keras defaults

#include "cohort/optim/optimizer.hpp"

namespace cohort::optim {

struct AdamOptions {
  Schedule learning_rate = constant(1e-3);
  double beta_1 = 0.9;
  double beta_2 = 0.999;
  double epsilon = 1e-7;
  double weight_decay = 0.0;
  double decay = 0.0;
};

class Adam : public Optimizer {
 public:
  explicit Adam(AdamOptions options = {});
  std::string name() const override { return "Adam"; }
  int slots_per_variable() const override { return 2; }

 protected:
  double step_size(double learning_rate) const override;
  void update(const std::vector<VariableState>& variables, const Tensor& step_size) override;

 private:
  AdamOptions options_;
};

}  // namespace cohort::optim
