#pragma once
// RingAllreduce: Horovod-style data parallelism. Every process holds the whole model; the chief's
// variables are broadcast at the start; each step every process computes gradients on its share of the
// global batch, and the ring allreduce averages them, weighted by each process's sample count, so that
// W processes at batch B take exactly the steps one process takes at batch W x B (up to float rounding).
// Then every process applies the same update with its own optimizer.
//
// Data: by default an epoch is one pass over the data set across all processes (DataPolicy::OnePass);
// EachWorkerFullPass reproduces TensorFlow's behaviour, where every worker reads the whole set.
// BatchNormalization statistics are not synchronized: each process normalizes with its own batch.
//
//   auto cluster = cluster::Cluster::from_environment();
//   Trainer trainer(model, optim::SGD(...), std::make_shared<train::RingAllreduce>(cluster.transport()));

#include <vector>

#include "cohort/comm/transport.hpp"
#include "cohort/train/strategy.hpp"

namespace cohort::train {

struct RingAllreduceOptions {
  DataPolicy data = DataPolicy::OnePassPerEpoch;
};

class RingAllreduce : public Strategy {
 public:
  // `transport` must outlive the strategy.
  explicit RingAllreduce(comm::Transport& transport, RingAllreduceOptions options = {});

  std::string name() const override { return "ring-allreduce"; }
  int replicas() const override { return transport_.size(); }
  bool is_chief() const override { return transport_.rank() == 0; }
  void initialize(nn::Sequential& model, optim::Optimizer& optimizer) override;
  void apply_gradients(nn::Sequential& model, optim::Optimizer& optimizer, std::int64_t samples) override;
  DataShare data_share() const override;

 private:
  comm::Transport& transport_;
  RingAllreduceOptions options_;
  std::vector<float> buffer_;  // every gradient, then the sample count
};

}  // namespace cohort::train
