#pragma once
// GradientSynchronizer: how the gradients the replicas computed become one update of every replica's
// variables. For each update a strategy calls begin() before the backward pass, with the samples the
// gradients stand for; gradients_ready() as backward makes each layer's gradients final (from the last
// layer back; each holds the mean over this replica's samples); then finish(), which completes the exchange
// and updates the variables. A synchronizer may start moving gradients as soon as they are ready, and
// finish() also works without the announcements (every gradient is then final).
//
// The synchronizers: BucketedAllreduce (every replica reduces every gradient, over the ring, the hierarchy,
// MPI or NCCL; a bfloat16 wire or a codec) and ShardedAllreduce (ZeRO stages 1 and 2). RingAllreduce
// composes one with a ProcessGroup.
//
//   train::ProcessGroup group({comm::make_ring_communicator(transport)});
//   train::BucketedAllreduce synchronizer(group, {});
//   synchronizer.begin(model, samples);
//   model.backward(dy, [&](auto ready) { synchronizer.gradients_ready(ready); });
//   synchronizer.finish(model, optimizer, nullptr);

#include <cstdint>
#include <span>
#include <string>

#include "cohort/nn/sequential.hpp"
#include "cohort/optim/optimizer.hpp"
#include "cohort/train/loss_scale.hpp"

namespace cohort::train {

// Since the start: the bytes of this replica's gradients, and what of them it handed to reductions over
// the replicas (half under a bfloat16 wire, less through a codec).
struct GradientTraffic {
  double gradient_bytes = 0, reduced_bytes = 0;
};

class GradientSynchronizer {
 public:
  virtual ~GradientSynchronizer() = default;

  virtual std::string name() const = 0;
  virtual void begin(nn::Sequential& model, std::int64_t samples) = 0;
  virtual void gradients_ready(std::span<const nn::VariablePtr> variables) = 0;
  // With `loss_scale` (mixed_float16) the reduced gradients are divided by it, and a step whose gradients
  // are not all finite is skipped on every replica alike.
  virtual void finish(nn::Sequential& model, optim::Optimizer& optimizer, LossScale* loss_scale) = 0;

  // Seconds spent waiting for communication that backward did not hide, since the start.
  virtual double exposed_seconds() const = 0;
  virtual GradientTraffic traffic() const = 0;
  // What the chief prints before training (how the work is shared out); may be empty.
  virtual std::string setup_report() const { return {}; }
};

}  // namespace cohort::train
