#pragma once
// RMSprop with Keras defaults: learning rate 1e-3, rho 0.9, momentum 0, epsilon 1e-7, not centered.
//
//   optim::RMSprop rms({.momentum = 0.9, .centered = true});

#include "cohort/optim/optimizer.hpp"

namespace cohort::optim {

struct RMSpropOptions {
  Schedule learning_rate = constant(1e-3);
  double rho = 0.9;
  double momentum = 0.0;
  double epsilon = 1e-7;
  bool centered = false;
  double weight_decay = 0.0;
  double decay = 0.0;
};

class RMSprop : public Optimizer {
 public:
  explicit RMSprop(RMSpropOptions options = {});
  std::string name() const override { return "RMSprop"; }
  int slots_per_variable() const override { return 1 + (options_.centered ? 1 : 0) + (options_.momentum > 0 ? 1 : 0); }

 protected:
  void update(const std::vector<VariableState>& variables, const Tensor& step_size) override;

 private:
  RMSpropOptions options_;
};

}  // namespace cohort::optim
