#pragma once
// RingAllreduce: Horovod-style data parallelism. Every process holds the whole model; the chief's
// variables are broadcast at the start; each step every process computes gradients on its share of the
// global batch, and an allreduce averages them, weighted by each process's sample count, so that
// W processes at batch B take exactly the steps one process takes at batch W x B (up to float rounding).
// Then every process applies the same update with its own optimizer.
//
// The allreduce runs on a Communicator chosen by the device of the gradients, Horovod-style: of the
// communicators given, in order of preference, the first that accepts that device carries them (NCCL for
// GPU memory, the ring or Open MPI for host memory); when none does (a GPU without NCCL, the emulated
// device), the first one reduces a pinned host copy. When this build has NCCL and no GPU communicator
// was given, initialize() sets one up over the host communicator if every rank trains on a GPU of its
// own (comm/nccl.hpp); ranks that share a GPU keep the pinned host path.
//
// Data: by default an epoch is one pass over the data set across all processes (DataPolicy::OnePass);
// EachWorkerFullPass reproduces TensorFlow's behaviour, where every worker reads the whole set.
// BatchNormalization statistics are not synchronized: each process normalizes with its own batch.
//
//   auto cluster = cluster::Cluster::from_environment();
//   Trainer trainer(model, optim::SGD(...), std::make_shared<train::RingAllreduce>(cluster.transport()));

#include <memory>
#include <vector>

#include "cohort/comm/communicator.hpp"
#include "cohort/comm/transport.hpp"
#include "cohort/train/strategy.hpp"

namespace cohort::train {

struct RingAllreduceOptions {
  DataPolicy data = DataPolicy::OnePassPerEpoch;
};

class RingAllreduce : public Strategy {
 public:
  // The ring over `transport`, which must outlive the strategy.
  explicit RingAllreduce(comm::Transport& transport, RingAllreduceOptions options = {});
  explicit RingAllreduce(std::shared_ptr<comm::Communicator> communicator, RingAllreduceOptions options = {});
  // All communicators span the same ranks.
  explicit RingAllreduce(std::vector<std::shared_ptr<comm::Communicator>> communicators,
                         RingAllreduceOptions options = {});

  std::string name() const override;
  int replicas() const override { return communicators_.front()->size(); }
  bool is_chief() const override { return communicators_.front()->rank() == 0; }
  void initialize(nn::Sequential& model, optim::Optimizer& optimizer) override;
  void apply_gradients(nn::Sequential& model, optim::Optimizer& optimizer, std::int64_t samples) override;
  DataShare data_share() const override;
  bool sum_over_replicas(std::span<double> values) override;

 private:
  // Runs one collective on `buffer` (any device), through the pinned host buffer when the communicator
  // does not take the buffer's device.
  void run_collective(const Tensor& buffer, bool broadcast);
  // Collective: puts NCCL first when every rank's gradients live on a GPU of its own.
  void add_gpu_communicator(Device device);

  Tensor fused_;    // every gradient, then the sample count, on the model's device
  Tensor staging_;  // its host copy, where the communicator needs one
  RingAllreduceOptions options_;
  // Last: destroyed first, so that their threads stop before the buffers above go away.
  std::vector<std::shared_ptr<comm::Communicator>> communicators_;
};

}  // namespace cohort::train
