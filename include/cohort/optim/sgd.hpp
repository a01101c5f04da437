#pragma once
// SGD with momentum, Nesterov momentum and L2 weight decay; Keras defaults (learning rate 0.01, no momentum).
//
//   optim::SGD sgd({.learning_rate = optim::constant(0.1), .momentum = 0.9, .nesterov = true});

#include "cohort/optim/optimizer.hpp"

namespace cohort::optim {

struct SGDOptions {
  Schedule learning_rate = constant(0.01);
  double momentum = 0.0;
  bool nesterov = false;
  double weight_decay = 0.0;  // L2: adds weight_decay * w to each gradient
  double decay = 0.0;         // Keras legacy: lr / (1 + decay * iterations)
};

class SGD : public Optimizer {
 public:
  explicit SGD(SGDOptions options = {});
  std::string name() const override { return "SGD"; }
  int slots_per_variable() const override { return options_.momentum > 0 ? 1 : 0; }

 protected:
  void update(const std::vector<VariableState>& variables, const Tensor& step_size) override;

 private:
  SGDOptions options_;
};

}  // namespace cohort::optim
