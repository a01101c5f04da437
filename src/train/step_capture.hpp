#pragma once
// A training step captured on the model's device (tensor/capture.hpp) and replayed for each batch of the same
// shapes, the batch first copied into the input buffers it was recorded with. The recording is valid while
// the buffers it reads and writes are the ones the model and the optimizer still use: no other forward pass of
// the model (which may make new buffers in its layers) and no variable, gradient or optimizer slot replaced
// since. Otherwise the trainer drops it and runs the step op by op, which is also the warm-up a capture waits
// for: a step of the same shapes that made every plan, slot and buffer before any is recorded.
#include <functional>
#include <memory>
#include <vector>

#include "cohort/nn/sequential.hpp"
#include "cohort/optim/optimizer.hpp"
#include "cohort/tensor/capture.hpp"

namespace cohort::train {

class StepCapture {
 public:
  using Step = std::function<void(const Tensor& images, const Tensor& targets)>;

  // Whether replay() does the step of these inputs now.
  bool replays(const Tensor& images, const Tensor& targets, const nn::Sequential& model,
               const optim::Optimizer& optimizer) const;
  // Copies the inputs into the recorded buffers and replays the step.
  void replay(const Tensor& images, const Tensor& targets);
  // Whether the step before ran op by op on inputs of these shapes: the warm-up a capture waits for.
  bool warmed_for(const Tensor& images, const Tensor& targets) const;
  // Records `step` run on copies of the inputs, then replays it: the step of these inputs is done, once. A
  // DeviceError when the step cannot be recorded; nothing of it ran on the device then.
  void capture(const Tensor& images, const Tensor& targets, const nn::Sequential& model,
               const optim::Optimizer& optimizer, const Step& step);
  // A step ran op by op: the recording is dropped, and that step is the warm-up for its shapes.
  void ran_uncaptured(const Tensor& images, const Tensor& targets);
  // Drops the recording and the warm-up (a new epoch's sums, the end of training).
  void drop();

 private:
  struct Inputs {
    Shape images, targets;
    DType images_type, targets_type;
    bool operator==(const Inputs&) const = default;
  };
  static Inputs inputs_of(const Tensor& images, const Tensor& targets);
  // The storage of every buffer the step reads or writes that lives on beyond it, and the model's passes.
  struct Buffers {
    std::vector<void*> addresses;
    std::uint64_t passes = 0;
    bool operator==(const Buffers&) const = default;
  };
  static Buffers buffers_of(const nn::Sequential& model, const optim::Optimizer& optimizer);

  std::optional<Inputs> warmed_;
  std::unique_ptr<CapturedWork> work_;
  Tensor images_, targets_;  // the recorded input buffers
  Buffers buffers_;
};

}  // namespace cohort::train
