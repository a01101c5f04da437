#pragma once
// RingAllreduce: Horovod-style data parallelism. Every process holds the whole model; the chief's
// variables are broadcast at the start; each step every process computes gradients on its share of the
// global batch, and an allreduce averages them, weighted by each process's sample count, so that
// W processes at batch B take exactly the steps one process takes at batch W x B (up to float rounding).
// Then every process applies the same update with its own optimizer.
//
// The parts: a ProcessGroup (ranks, agreement, and the communicator for each device: of the communicators
// given, in order of preference, the first that accepts the gradients' device carries them, NCCL for GPU
// memory, the ring or Open MPI for host memory, else a pinned host copy), a gradient synchronizer
// (BucketedAllreduce, or ShardedAllreduce under ZeRO), the replicas' moving statistics averaged at each
// step, and a state store (the whole model, or sharded state). When this build has NCCL and no GPU
// communicator was given, initialize() sets one up over the host communicator if every rank trains on a
// GPU of its own (comm/nccl.hpp); ranks that share a GPU keep the pinned host path.
//
// Data: by default an epoch is one pass over the data set across all processes (DataPolicy::OnePass);
// EachWorkerFullPass reproduces TensorFlow's behaviour, where every worker reads the whole set.
// SyncBatchNormalization sums its per-channel moments over the replicas on the same communicator, in the
// order the layers ask, which is the same on every rank (nn/sync_batch_normalization.hpp).
// Non-trainable variables (BatchNormalization's moving statistics): each process normalizes with its own
// batch and moves its own statistics, which an allreduce started with the step's gradients then averages,
// so that every replica, the checkpoints and the saved model hold the same mean of the replicas' statistics.
//
// Overlap: gradients travel in buckets whose allreduce starts as soon as backward has made their last
// gradient final (bucketed_synchronizer.hpp). Sharded updates (RingAllreduceOptions::zero_stage) keep
// each rank's share of the optimizer state only (sharded_allreduce.hpp); their checkpoints are sharded
// too, and resume on any process count, sharded or not (state_store.hpp).
//
//   auto cluster = cluster::Cluster::from_environment();
//   Trainer trainer(model, optim::SGD(...), std::make_shared<train::RingAllreduce>(cluster.transport()));
//   train::RingAllreduce zero2(cluster.transport(), {.zero_stage = 2});

#include <memory>
#include <optional>
#include <vector>

#include "cohort/comm/communicator.hpp"
#include "cohort/comm/transport.hpp"
#include "cohort/train/bucketed_allreduce.hpp"
#include "cohort/train/gradient_codec.hpp"
#include "cohort/train/process_group.hpp"
#include "cohort/train/sharded_allreduce.hpp"
#include "cohort/train/state_store.hpp"
#include "cohort/train/strategy.hpp"

namespace cohort::train {

struct RingAllreduceOptions {
  DataPolicy data = DataPolicy::OnePassPerEpoch;
  // Bucket sizes: the first (the last layers' gradients) and the others. A variable larger than a bucket
  // travels alone; 0 puts every variable in a bucket of its own.
  std::size_t first_bucket_bytes = std::size_t{1} << 20;
  std::size_t bucket_bytes = std::size_t{4} << 20;
  // What the gradients travel as: bfloat16 halves the bytes (comm::AllreduceOptions::wire; the ring
  // communicator carries it); the sums are float32, rounded to bfloat16 once, alike on every replica.
  DType gradient_dtype = DType::Float32;
  // 0: every rank updates every variable; 1: the optimizer state is sharded over the ranks; 2: the reduced
  // gradients too (a reduce-scatter instead of the allreduce; float32 gradients only).
  int zero_stage = 0;
  // A codec that sends less than the gradients themselves (PowerSGD, or any GradientCodecLike type):
  // each bucket goes through it after backward, not overlapped with it; float32 gradients, no sharding.
  std::optional<GradientCodec> codec{};
};

class RingAllreduce : public Strategy {
 public:
  // The ring over `transport`, which must outlive the strategy.
  explicit RingAllreduce(comm::Transport& transport, RingAllreduceOptions options = {});
  explicit RingAllreduce(std::shared_ptr<comm::Communicator> communicator, RingAllreduceOptions options = {});
  // All communicators span the same ranks. Refuses options that do not go together.
  explicit RingAllreduce(std::vector<std::shared_ptr<comm::Communicator>> communicators,
                         RingAllreduceOptions options = {});
  ~RingAllreduce() override;

  std::string name() const override { return synchronizer_->name(); }
  Replicas& replica_group() const override { return *group_; }
  GradientSynchronizer& synchronizer() const override { return *synchronizer_; }
  StateStore& state_store() override { return *state_store_; }
  void initialize(nn::Sequential& model, optim::Optimizer& optimizer) override;
  // comm_seconds: the time steps waited for allreduces that backward did not hide, since the last epoch.
  void add_epoch_logs(Logs& logs) override { add_exposed_seconds(logs); }
  // The gradients' bytes per codec or wire type, and what each rank kept of the optimizer's state.
  std::string final_report() override;
  void finish(const History& history, const optim::Optimizer& optimizer) override;

  // The buckets as planned (after initialize()): each one's variable names, in launch order.
  std::vector<std::vector<std::string>> bucket_plan() const { return synchronizer_->bucket_plan(); }
  // This rank's optimizer state, in bytes, at the end of fit().
  std::uint64_t optimizer_state_bytes() const { return optimizer_state_bytes_; }
  using GradientTraffic = train::GradientTraffic;
  GradientTraffic gradient_traffic() const { return synchronizer_->traffic(); }

 private:
  bool sharded() const { return options_.zero_stage > 0; }
  // The replicas send gradients as the same type, shard alike and use the same codec.
  void check_replicas_agree();

  RingAllreduceOptions options_;
  std::unique_ptr<BucketedSynchronizer> synchronizer_;
  std::unique_ptr<StateStore> state_store_;
  std::uint64_t optimizer_state_bytes_ = 0;
  std::vector<double> optimizer_state_bytes_per_rank_;  // after finish()
  // Last: destroyed first, so that the communicators' threads stop before the buffers above go away.
  std::shared_ptr<ProcessGroup> group_;
};

}  // namespace cohort::train
