#pragma once
// GradientSynchronizer: how the gradients the replicas computed become one update of every replica's
// variables. For each update a strategy calls begin() before the backward pass, with the samples the
// gradients stand for; gradients_ready() as backward makes each layer's gradients final (from the last
// layer back; each holds the mean over this replica's samples); then finish(), which completes the exchange
// and updates the variables. A synchronizer may start moving gradients as soon as they are ready, and
// finish() also works without the announcements (every gradient is then final).
//
// The synchronizers: LocalUpdate (one process), BucketedAllreduce (every replica reduces every gradient,
// over the ring, the hierarchy, MPI or NCCL; a bfloat16 wire or a codec), ShardedAllreduce (ZeRO stages 1
// and 2) and ParameterStoreSynchronizer (the servers update). RingAllreduce composes one of the allreduce
// synchronizers with a ProcessGroup; ParameterServer the parameter store with its workers.
//
//   train::ProcessGroup group({comm::make_ring_communicator(transport)});
//   train::BucketedAllreduce synchronizer(group, {});
//   synchronizer.begin(model, samples);
//   model.backward(dy, [&](auto ready) { synchronizer.gradients_ready(ready); });
//   synchronizer.finish(model, optimizer);

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
  virtual void finish(nn::Sequential& model, optim::Optimizer& optimizer) = 0;

  // Seconds spent waiting for communication that backward did not hide, since the start.
  virtual double exposed_seconds() const = 0;
  virtual GradientTraffic traffic() const = 0;
  // What the chief prints before training (how the work is shared out); may be empty.
  virtual std::string setup_report() const { return {}; }

  // Dynamic loss scaling (mixed_float16): from now on finish() divides the reduced gradients by `scale` and
  // skips a step whose gradients are not all finite, on every replica alike. False, taking nothing, where
  // the replicas could disagree on a skip (servers that each may count other workers' gradients).
  virtual bool set_loss_scale(LossScale* scale) {
    loss_scale_ = scale;
    return true;
  }
  // Whether the update happens elsewhere (parameter servers): what a process writes into its model's
  // variables, or its optimizer's learning rate, is not what the update uses.
  virtual bool updates_elsewhere() const { return false; }
  // The optimizer's state was replaced (a resumed checkpoint holds the whole of it).
  virtual void optimizer_state_replaced() {}
  // Whether begin(), gradients_ready() and finish() only queue ops on the model's device, the same ones at every
  // step, so that a captured step (tensor/capture.hpp) may record them: no messages, no reads to the host.
  virtual bool capturable() const { return false; }

 protected:
  LossScale* loss_scale_ = nullptr;
};

// One process: the gradients are the update's, applied at once.
class LocalUpdate final : public GradientSynchronizer {
 public:
  std::string name() const override { return "local"; }
  void begin(nn::Sequential&, std::int64_t) override {}
  void gradients_ready(std::span<const nn::VariablePtr>) override {}
  void finish(nn::Sequential& model, optim::Optimizer& optimizer) override;
  double exposed_seconds() const override { return 0; }
  GradientTraffic traffic() const override { return {}; }
  // A loss scale reads the gradients back to skip a step that is not finite.
  bool capturable() const override { return loss_scale_ == nullptr; }
};

}  // namespace cohort::train
