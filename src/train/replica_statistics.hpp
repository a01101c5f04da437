#pragma once
// The non-trainable variables (BatchNormalization's moving statistics) averaged over the replicas at each
// step. Each replica normalizes with its own batch and moves its own statistics; start() sums them over
// the replicas while backward runs, and finish() makes every replica's the mean, so that every replica,
// the checkpoints and the saved model hold the same statistics.

#include <vector>

#include "cohort/comm/work.hpp"
#include "cohort/nn/sequential.hpp"
#include "cohort/train/process_group.hpp"

namespace cohort::train {

class ReplicaStatistics {
 public:
  // `group` must outlive this.
  explicit ReplicaStatistics(ProcessGroup& group) : group_(group) {}

  // Finds the model's statistics and declares their buffer (every rank, before any step).
  void prepare(const nn::Sequential& model);
  // After the step's last forward pass, which moved them.
  void start(const nn::Sequential& model);
  // Waits for the sums and writes the means into the variables.
  void finish();

 private:
  ProcessGroup& group_;
  std::vector<nn::VariablePtr> variables_;
  bool planned_ = false;
  Tensor sums_, staging_;
  comm::WorkPtr work_;
};

}  // namespace cohort::train
