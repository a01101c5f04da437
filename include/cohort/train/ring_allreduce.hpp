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
// SyncBatchNormalization sums its per-channel moments over the replicas on the same communicator, in the
// order the layers ask, which is the same on every rank (nn/sync_batch_normalization.hpp).
// Non-trainable variables (BatchNormalization's moving statistics): each process normalizes with its own
// batch and moves its own statistics, which an allreduce started with the step's gradients then averages,
// so that every replica, the checkpoints and the saved model hold the same mean of the replicas' statistics.
//
// Overlap: gradients travel in buckets (variables in reverse creation order, the order backward finishes
// them; a small first bucket so that communication starts early, DDP-style). A bucket is scaled by this
// process's sample count and its allreduce starts on the communicator's thread as soon as backward has
// made its last gradient final, while the layers before it are still computed; buckets start in the same
// order on every rank. apply_gradients() waits for the buckets in order and updates.
//
// Sharded updates (ZeRO, Rajbhandari et al. 2020; RingAllreduceOptions::zero_stage): each bucket is cut
// into one block per rank, and a rank keeps the optimizer state of its blocks alone, updates only those
// elements of the variables and allgathers the updated blocks, so that the optimizer state per rank falls
// by the rank count. Stage 1 still allreduces the gradients (every rank holds the whole reduced gradients,
// as without sharding); stage 2 reduce-scatters them, so each rank receives the sum of its blocks only.
// The optimizer must update each element from its own gradient and state (SGD, Adam, RMSprop do).
// Checkpoints: each rank writes the state of its blocks beside the chief's checkpoint, which names the
// shards; loading assembles them whole, so a sharded run resumes on any process count, sharded or not.
//
//   auto cluster = cluster::Cluster::from_environment();
//   Trainer trainer(model, optim::SGD(...), std::make_shared<train::RingAllreduce>(cluster.transport()));
//   train::RingAllreduce zero2(cluster.transport(), {.zero_stage = 2});

#include <memory>
#include <optional>
#include <vector>

#include "cohort/comm/communicator.hpp"
#include "cohort/comm/transport.hpp"
#include "cohort/train/strategy.hpp"
#include "cohort/train/gradient_buckets.hpp"
#include "cohort/train/gradient_codec.hpp"
#include "cohort/train/variable_pieces.hpp"

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

class RingAllreduce : public Strategy, private ReplicaReduction {
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
  std::string process_name() const override { return communicators_.front()->process_name(communicators_.front()->rank()); }
  int process_index() const override { return communicators_.front()->rank(); }
  std::string replica_name(int replica) const override { return communicators_.front()->process_name(replica); }
  void initialize(nn::Sequential& model, optim::Optimizer& optimizer) override;
  void apply_gradients(nn::Sequential& model, optim::Optimizer& optimizer, std::int64_t samples) override;
  void begin_gradients(nn::Sequential& model, std::int64_t samples) override;
  void gradients_ready(std::span<const nn::VariablePtr> variables) override;
  DataShare data_share() const override;
  // The buckets as planned (after initialize()): each one's variable names, in launch order.
  std::vector<std::vector<std::string>> bucket_plan() const;
  bool sum_over_replicas(std::span<double> values) override;
  // SyncBatchNormalization's moments, summed on the gradients' communicator in the order the layers ask.
  nn::ReplicaSum* replica_sum() override { return replicas() > 1 ? this : nullptr; }
  // comm_seconds: the time steps waited for allreduces that backward did not hide, since the last epoch.
  void add_epoch_logs(Logs& logs) override;
  void announce_failure(const std::string& reason) override {
    for (const auto& communicator : communicators_) communicator->announce_failure(reason);
  }
  // Sharded: every rank writes its shard of the optimizer state, then the chief the checkpoint naming them.
  void save_checkpoint(const std::filesystem::path& directory, const nn::Sequential& model,
                       const optim::Optimizer& optimizer, const TrainingPosition& position) override;
  // How the optimizer state is shared out (sharded runs), and what each rank kept (every run of several).
  std::string setup_report() const override;
  std::string final_report() override;
  void finish(const History& history) override;
  // This rank's optimizer state, in bytes, after the last step.
  std::uint64_t optimizer_state_bytes() const { return optimizer_state_bytes_; }
  // Since the start: the bytes of this rank's gradients, and what of them it handed to reductions over the
  // replicas (half under a bfloat16 wire, less through a codec).
  struct GradientTraffic {
    double gradient_bytes = 0, reduced_bytes = 0;
  };
  GradientTraffic gradient_traffic() const { return {gradient_bytes_, wire_bytes_}; }

 private:
  // The communicator that carries buffers on `device`, and whether it takes them as they are.
  std::pair<comm::Communicator*, bool> communicator_for(Device device) const;
  // Starts one collective on `buffer` (any device), through `staging` (pinned host memory of the same
  // size) when the communicator does not take the buffer's device; the caller then copies the result back.
  enum class Collective { Allreduce, Broadcast, ReduceScatter, Allgather };
  comm::WorkPtr start_collective(const Tensor& buffer, const Tensor& staging, Collective collective, DType wire);
  // Collective: puts NCCL first when every rank's gradients live on a GPU of its own.
  void add_gpu_communicator(Device device);
  // Plans the buckets and their buffers for the model's trainable variables on its device, and the
  // buffer in which the non-trainable ones are averaged.
  void plan_buckets(const nn::Sequential& model);
  // Starts the sum of the non-trainable variables over the replicas; finish_statistics() makes it the mean.
  void start_statistics();
  void finish_statistics();
  void sum(const Tensor& values) override;
  // Each bucket through the codec, in launch order.
  void reduce_through_codec();
  // Starts the allreduce of every complete bucket whose predecessors have started.
  void start_ready_buckets();

  bool sharded() const { return options_.zero_stage > 0; }
  // This rank's pieces of the variables: the elements of each that fall in its blocks of the buckets.
  void plan_pieces();
  std::vector<VariablePiece> variable_pieces() const;
  // The sharded step: this rank's pieces updated from their reduced gradients (scaled by `inverse`),
  // then every rank's pieces gathered into every replica's variables.
  void update_pieces(nn::Sequential& model, optim::Optimizer& optimizer, float inverse);
  // Whether any replica's pieces hold a gradient that is not finite, the first such variable named.
  bool pieces_finite_everywhere(const std::vector<Tensor>& gradients, std::string& culprit);
  void gather_variables();

  struct BucketState {
    std::size_t waiting = 0;  // gradients not yet final this step
    comm::WorkPtr work;
    comm::WorkPtr count_work;  // the last bucket's sample count, when it travels apart
  };
  RingAllreduceOptions options_;
  GradientBuckets buckets_;
  std::vector<BucketState> bucket_states_;
  std::vector<bool> announced_;  // per variable of buckets_, this step
  std::size_t next_bucket_ = 0;  // the next one to start
  bool step_begun_ = false;
  float step_samples_ = 0;
  Tensor fused_;    // every gradient in bucket order, then the sample count, on the model's device
  Tensor staging_;  // its host copy, where the communicator needs one
  bool staged_ = false;
  std::vector<nn::VariablePtr> statistics_variables_;  // the non-trainable ones, averaged each step
  Tensor statistics_, statistics_staging_;
  comm::WorkPtr statistics_work_;
  Tensor replica_sum_staging_;  // pinned host memory for sum(), where the communicator needs it
  double exposed_seconds_ = 0, reported_exposed_seconds_ = 0;
  struct Piece {
    std::size_t variable;          // into buckets_.variables()
    std::int64_t begin, end;       // elements of the variable
    std::int64_t offset;           // of its first element in fused_
  };
  std::vector<Piece> pieces_;
  bool state_cut_to_pieces_ = false;  // the optimizer keeps the state of this rank's pieces only
  std::uint64_t optimizer_state_bytes_ = 0;
  std::vector<double> optimizer_state_bytes_per_rank_;  // after finish()
  double gradient_bytes_ = 0, wire_bytes_ = 0;  // since the start: what the gradients are, and what was sent of them
  // Last: destroyed first, so that their threads stop before the buffers above go away.
  std::vector<std::shared_ptr<comm::Communicator>> communicators_;
};

}  // namespace cohort::train
