#pragma once
// A training step captured on the model's device (tensor/capture.hpp) and replayed for each batch of the same
// shapes, the batch first copied into the input buffers it was recorded with. The recording is valid while
// the buffers it reads and writes are the ones the model and the optimizer still use: no other forward pass of
// the model (which may make new buffers in its layers) and no variable, gradient or optimizer slot replaced
// since. Otherwise the trainer drops it and runs the step op by op, which is also the warm-up a capture waits
// for: a step of the same shapes that made every plan, slot and buffer before any is recorded.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cohort/nn/sequential.hpp"
#include "cohort/optim/optimizer.hpp"
#include "cohort/tensor/capture.hpp"

namespace cohort::train {

class StepCapture {
 public:
  // A step's parts: `run` does all of it (the device's ops and the host's bookkeeping), `redo_host_part` the
  // host's bookkeeping alone, after a replay; `save_host_part` returns what undoes the bookkeeping of a `run` that
  // was being recorded when the recording failed.
  struct Step {
    std::function<void(const Tensor& images, const Tensor& targets)> run;
    std::function<void()> redo_host_part;
    std::function<std::function<void()>()> save_host_part;
  };

  // Runs `step` on these inputs: as the replay of its recording where one fits them (same shapes, the model and
  // the optimizer with the buffers it recorded; `optimizer` null where the step updates nothing), recorded now
  // and replayed where the step before ran op by op on the same shapes (the warm-up), else op by op. Where the
  // recording fails, its bookkeeping is undone, the step runs op by op and the reason is returned.
  std::optional<std::string> run(const Tensor& images, const Tensor& targets, const nn::Sequential& model,
                                 const optim::Optimizer* optimizer, const Step& step);
  // Drops the recording and the warm-up (a step that may not be captured).
  void drop();

  // Drops the recording on entering a scope and on leaving it, whichever way: one that adds to sums of that
  // scope (an epoch's) must never be replayed after them.
  class Scope {
   public:
    explicit Scope(StepCapture& capture) : capture_(capture) { capture_.drop(); }
    ~Scope() { capture_.drop(); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    StepCapture& capture_;
  };

 private:
  struct Inputs {
    Shape images, targets;
    DType images_type, targets_type;
    bool operator==(const Inputs&) const = default;
  };
  static Inputs inputs_of(const Tensor& images, const Tensor& targets);
  // The storage of every buffer the step reads or writes that lives on beyond it, which variables it updates,
  // the model's precision and its passes.
  struct Buffers {
    std::vector<void*> addresses;
    std::vector<bool> trainable;
    nn::Precision precision = nn::Precision::Float32;
    std::uint64_t passes = 0;
    bool operator==(const Buffers&) const = default;
  };
  static Buffers buffers_of(const nn::Sequential& model, const optim::Optimizer* optimizer);
  // Records `step` on copies of the inputs, then replays it; DeviceError where it cannot be recorded.
  void capture(const Tensor& images, const Tensor& targets, const nn::Sequential& model,
               const optim::Optimizer* optimizer, const Step& step);

  std::optional<Inputs> warmed_;
  std::unique_ptr<CapturedWork> work_;
  Tensor images_, targets_;  // the recorded input buffers
  Buffers buffers_;
};

}  // namespace cohort::train
