#pragma once
// What the bucketed synchronizers share (BucketedAllreduce, ShardedAllreduce). The trainable variables'
// gradients are laid out in the buckets of one flat buffer on the model's device (gradient_buckets.hpp),
// and each variable's gradient is a view of its slot: backward writes straight into what the collectives
// read, with no copy in or out. As backward makes a gradient final it is weighted by this replica's
// samples in place, and each bucket starts, in the same order on every rank, once its last gradient is
// final, while the layers before it are still computed. The step's sample count travels after the last
// bucket; finish() divides the summed gradients by the summed counts once, which gives the gradient of
// the mean loss over the whole global batch, however unevenly it was shared.
// The replicas' moving statistics (the non-trainable variables) are averaged along each step: their sum
// travels while backward runs, and after the update every replica holds their mean, so that replicas,
// checkpoints and saved models agree.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cohort/comm/work.hpp"
#include "cohort/train/gradient_buckets.hpp"
#include "cohort/train/gradient_synchronizer.hpp"
#include "cohort/train/process_group.hpp"

namespace cohort::train {

class ReplicaStatistics;

struct BucketSizes {
  // The first bucket (the last layers' gradients, so that communication starts early, DDP-style) and the
  // others. A variable larger than a bucket travels alone; 0 puts every variable in a bucket of its own.
  std::size_t first_bucket_bytes = std::size_t{1} << 20;
  std::size_t bucket_bytes = std::size_t{4} << 20;
};

class BucketedSynchronizer : public GradientSynchronizer {
 public:
  ~BucketedSynchronizer() override;
  // Plans the buckets for the model's trainable variables now (the first begin() does otherwise), so that
  // bucket_plan() and setup_report() can tell them before training, and declares the buffers of the
  // moving statistics (every rank, before its first step).
  void prepare(const nn::Sequential& model);
  void begin(nn::Sequential& model, std::int64_t samples) override;
  void gradients_ready(std::span<const nn::VariablePtr> variables) override;
  // Updates the variables (update()), then averages the moving statistics.
  void finish(nn::Sequential& model, optim::Optimizer& optimizer) final;
  double exposed_seconds() const override { return exposed_seconds_; }
  GradientTraffic traffic() const override { return traffic_; }
  // The buckets as planned (after the first begin()): each one's variable names, in launch order.
  std::vector<std::vector<std::string>> bucket_plan() const;

 protected:
  // `blocks`: every bucket's length a multiple of it (a block per rank for sharded updates). `count_apart`:
  // the sample count travels as a float32 allreduce of its own, not at the end of the last bucket (where
  // the wire is 16-bit, or a reduce-scatter would bring it to one rank only, or a codec reduces the buckets).
  BucketedSynchronizer(ProcessGroup& group, BucketSizes sizes, std::int64_t blocks, bool count_apart);

  // Completes the exchange and updates the trainable variables; with `loss_scale`, unscales them first, or
  // skips the step alike on every rank.
  virtual void update(nn::Sequential& model, optim::Optimizer& optimizer, LossScale* loss_scale) = 0;
  // Starts the exchange of one bucket, `values` in the buffer and `staging` its pinned host copy where the
  // device is staged; null when there is nothing to start.
  virtual comm::WorkPtr start_bucket(const Tensor& values, const Tensor& staging) = 0;
  // Announces what backward did not, waits for every bucket and the count, and copies the buffer back from
  // the staging from element `staged_from` on. Returns the number of samples over every replica.
  double wait_for_buckets(std::int64_t staged_from = 0);
  // The gradients' part of the buffer (padding between slots included).
  Tensor gradient_values() const { return fused_.slice(0, buckets_.elements()); }
  // Pinned host memory beside the buffer, where the device is staged.
  Tensor staging_of(std::int64_t begin, std::int64_t end) const { return staged_ ? staging_.slice(begin, end) : Tensor(); }
  // Counts this step's gradients as reduced, travelling as `wire`.
  void count_reduced(DType wire) {
    traffic_.reduced_bytes += static_cast<double>(gradient_elements_) * static_cast<double>(element_size(wire));
  }
  // Called once the buckets are planned anew (the first step, another device, other variables).
  virtual void planned() {}
  // Adds the time of a wait that backward did not hide.
  void add_exposed(double seconds) { exposed_seconds_ += seconds; }

  ProcessGroup& group_;
  GradientBuckets buckets_;
  std::int64_t gradient_elements_ = 0;  // of the variables, without the padding between their slots
  Tensor fused_;  // every gradient in bucket order, then the sample count, on the model's device
  bool staged_ = false;
  GradientTraffic traffic_;

 private:
  // Plans the buckets for the model's trainable variables on its device, and points every gradient at its
  // slot (keeping what it held).
  void plan(const nn::Sequential& model);
  // Points `variable`'s gradient at its slot, copying what it held there.
  void view_slot(nn::Variable& variable, std::int64_t offset);
  void start_ready_buckets();

  std::unique_ptr<ReplicaStatistics> statistics_;
  BucketSizes sizes_;
  std::int64_t blocks_;
  bool count_apart_;
  Tensor staging_;  // the buffer's host copy, where the communicator needs one
  struct BucketState {
    std::size_t waiting = 0;  // gradients not yet final this step
    comm::WorkPtr work;
  };
  std::vector<BucketState> bucket_states_;
  comm::WorkPtr count_work_;      // the count, where it travels apart
  std::vector<bool> announced_;   // per variable of buckets_, this step
  std::size_t next_bucket_ = 0;   // the next one to start
  bool step_begun_ = false;
  float step_samples_ = 0;
  double exposed_seconds_ = 0;
};

}  // namespace cohort::train
