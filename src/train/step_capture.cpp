#include "train/step_capture.hpp"

#include "cohort/core/error.hpp"
#include "cohort/core/timeline.hpp"
#include "cohort/tensor/ops.hpp"

namespace cohort::train {

StepCapture::Inputs StepCapture::inputs_of(const Tensor& images, const Tensor& targets) {
  return {images.shape(), targets.shape(), images.dtype(), targets.dtype()};
}

StepCapture::Buffers StepCapture::buffers_of(const nn::Sequential& model, const optim::Optimizer* optimizer) {
  Buffers buffers;
  buffers.passes = model.passes();
  buffers.precision = model.precision();
  for (const auto& variable : model.variables()) {
    buffers.trainable.push_back(variable->trainable);
    buffers.addresses.push_back(variable->value.device_pointer());
    if (variable->gradient.defined()) buffers.addresses.push_back(variable->gradient.device_pointer());
  }
  if (optimizer != nullptr)
    for (const auto& [name, state] : optimizer->state())
      for (const Tensor& slot : state.slots) buffers.addresses.push_back(slot.device_pointer());
  return buffers;
}

std::optional<std::string> StepCapture::run(const Tensor& images, const Tensor& targets, const nn::Sequential& model,
                                            const optim::Optimizer* optimizer, const Step& step) {
  if (work_ != nullptr && inputs_of(images, targets) == inputs_of(images_, targets_) &&
      buffers_of(model, optimizer) == buffers_) {
    {
      const timeline::Span span("step", "captured step");
      ops::copy(images, images_);
      ops::copy(targets, targets_);
      work_->replay();
    }
    step.redo_host_part();
    return std::nullopt;
  }
  if (warmed_ == inputs_of(images, targets)) {
    const std::function<void()> undo = step.save_host_part();
    try {
      capture(images, targets, model, optimizer, step);
      return std::nullopt;
    } catch (const DeviceError& e) {
      // Nothing of it ran on the device.
      undo();
      drop();
      step.run(images, targets);
      return e.what();
    }
  }
  drop();
  step.run(images, targets);
  warmed_ = inputs_of(images, targets);
  return std::nullopt;
}

void StepCapture::capture(const Tensor& images, const Tensor& targets, const nn::Sequential& model,
                          const optim::Optimizer* optimizer, const Step& step) {
  drop();
  Tensor recorded_images = images.clone(), recorded_targets = targets.clone();
  auto work = ops::capture(images.device(), [&] { step.run(recorded_images, recorded_targets); });
  images_ = std::move(recorded_images);
  targets_ = std::move(recorded_targets);
  buffers_ = buffers_of(model, optimizer);
  work_ = std::move(work);
  const timeline::Span span("step", "captured step");
  work_->replay();
}

void StepCapture::drop() {
  work_.reset();
  images_ = targets_ = Tensor();
  warmed_.reset();
}

}  // namespace cohort::train
