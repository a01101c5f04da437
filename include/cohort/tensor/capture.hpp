#pragma once
// Capture: the ops a piece of work queues on a GPU, recorded once and replayed for each batch (a CUDA graph),
// so that a training step costs one launch instead of one per op. The emulated device records as a GPU does,
// which tests captured work where no GPU is. The CPU runs each op as it is called and cannot record.
//
// A replay runs the recorded ops on the buffers they were recorded with, which the captured work keeps: inputs
// go into those buffers first (ops::copy), outputs are read from them. A value the host chooses anew for each
// replay (a learning rate, a step counter) lives on the device and is written before each replay from its
// source (set_step_scalar(), set_step_counter()); any other host value an op took was fixed when it was
// recorded. Work that makes the host wait for the device (ops::sum, copies to the host, synchronize) cannot be
// recorded. A step value is set once per capture, on a tensor made before it. While a thread captures on a
// device, other threads' ops there wait for the capture to end: a GPU captures its stream, so they would join
// the recording instead of running. A capture records without running the work, so the wait is short; the
// capturing thread must not wait on those threads.
//
//   Tensor input = ..., learning_rate = ops::scalar(0.1f, device);
//   auto step = ops::capture(device, [&] {
//     ops::set_step_scalar(learning_rate, [&] { return optimizer_rate(); });
//     ... ops on input ...
//   });
//   step->replay();                         // the recorded step itself; nothing ran while recording
//   ops::copy(next_batch, input);
//   step->replay();                         // the next one, with the rate its source gives now

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "cohort/tensor/tensor.hpp"

namespace cohort {

class BackendGraph;  // src/tensor/backend.hpp

class CapturedWork {
 public:
  struct StepValue {
    Tensor destination;
    std::function<std::uint64_t()> bits;  // what to write before a replay
    std::uint64_t recorded_bits;          // the source's value while the work was recorded
  };
  // `operands`: the tensors the recorded ops read and write, kept for as long as the work can be replayed.
  CapturedWork(Device device, std::unique_ptr<BackendGraph> graph, std::vector<StepValue> step_values,
               std::vector<Tensor> operands);
  ~CapturedWork();
  CapturedWork(const CapturedWork&) = delete;
  CapturedWork& operator=(const CapturedWork&) = delete;

  Device device() const { return device_; }
  // Queues the recorded ops again, after writing each step value: on the first replay the value its source had
  // while the work was recorded (that replay is the recorded work itself), on later ones its source's value now.
  void replay();
  std::int64_t replays() const { return replays_; }

 private:
  Device device_;
  std::unique_ptr<BackendGraph> graph_;
  std::vector<StepValue> step_values_;
  std::vector<Tensor> operands_;
  std::int64_t replays_ = 0;
};

namespace ops {

// Records instead of running the ops that `work` queues on `device` from this thread. DeviceError where the
// device cannot record, where `work` called an op that makes the host wait, or where a capture is under way
// there already; whatever `work` throws ends the capture and propagates. Nothing of `work` ran on the device
// then: the caller runs it again uncaptured if it still wants it done.
std::unique_ptr<CapturedWork> capture(Device device, const std::function<void()>& work);
// Whether this thread is capturing work on `device`.
bool capturing(Device device);

// Writes a float32 scalar on a device from `value` now or, while this thread captures there, before each replay.
void set_step_scalar(const Tensor& scalar, std::function<float()> value);
// The same for a step counter (ops::step_counter).
void set_step_counter(const Tensor& counter, std::function<std::uint64_t()> value);

}  // namespace ops
}  // namespace cohort
