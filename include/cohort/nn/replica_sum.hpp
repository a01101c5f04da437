#pragma once
// ReplicaSum: how a layer that computes over every replica's batch (SyncBatchNormalization) adds values up
// across the replicas of a data-parallel job. The training strategy provides it (train::RingAllreduce), so
// that nn knows nothing of processes or the network; a model trained by one process has none.

#include "cohort/tensor/tensor.hpp"

namespace cohort::nn {

class ReplicaSum {
 public:
  virtual ~ReplicaSum() = default;
  // Replaces `values` (float32, on the model's device) by their sum over all replicas, the same bits on
  // every one. Collective: every replica calls it, in the same order, with the same element count.
  virtual void sum(const Tensor& values) = 0;
};

}  // namespace cohort::nn
