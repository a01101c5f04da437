#include "cohort/tensor/capture.hpp"

#include <bit>
#include <optional>

#include "cohort/core/check.hpp"
#include "tensor/backend.hpp"

namespace cohort {
namespace {

// This thread's capture: its device, the step values met so far and the operands of its ops.
struct ActiveCapture {
  Device device;
  std::vector<CapturedWork::StepValue> step_values;
  std::vector<Tensor> operands;
};
thread_local std::optional<ActiveCapture> active;

// Writes `destination` now, or where this thread captures on its device, before each replay.
void set_step_value(const char* op, const Tensor& destination, std::function<std::uint64_t()> bits) {
  const std::uint64_t now = bits();
  if (active && active->device == destination.device()) {
    for (const CapturedWork::StepValue& value : active->step_values)
      if (value.destination.shares_storage_with(destination))
        throw DeviceError(fmt::format("{}: the captured work sets the same step value twice, and each replay can give "
                                      "it one value only",
                                      op));
    active->step_values.push_back({destination, std::move(bits), now});
    return;
  }
  backend_for(destination.device()).write_bits(destination, now);
}

}  // namespace

void keep_while_captured(std::span<const Tensor* const> operands) {
  if (!active) return;
  for (const Tensor* t : operands)
    if (t->defined() && t->device() == active->device) active->operands.push_back(*t);
}

void keep_while_captured(const Tensor& operand) {
  const Tensor* one = &operand;
  keep_while_captured({&one, 1});
}

void Backend::begin_capture() {
  throw DeviceError(fmt::format("{} cannot capture work: it runs each op as it is called", device_name(device())));
}

std::unique_ptr<BackendGraph> Backend::end_capture() {
  throw DeviceError(fmt::format("{} cannot capture work", device_name(device())));
}

CapturedWork::CapturedWork(Device device, std::unique_ptr<BackendGraph> graph, std::vector<StepValue> step_values,
                           std::vector<Tensor> operands)
    : device_(device), graph_(std::move(graph)), step_values_(std::move(step_values)), operands_(std::move(operands)) {}

CapturedWork::~CapturedWork() = default;

void CapturedWork::replay() {
  Backend& backend = backend_for(device_);
  for (const StepValue& value : step_values_)
    backend.write_bits(value.destination, replays_ == 0 ? value.recorded_bits : value.bits());
  graph_->launch();
  ++replays_;
}

namespace ops {

std::unique_ptr<CapturedWork> capture(Device device, const std::function<void()>& work) {
  if (active)
    throw DeviceError(fmt::format("a capture on {} is already under way on this thread", device_name(active->device)));
  Backend& backend = backend_for(device);
  backend.begin_capture();
  active.emplace(ActiveCapture{device, {}, {}});
  try {
    work();
  } catch (...) {
    active.reset();
    try {
      backend.end_capture();
    } catch (const Error&) {
      // The work's own failure says more than the capture's.
    }
    throw;
  }
  ActiveCapture ended = std::move(*active);
  active.reset();
  return std::make_unique<CapturedWork>(device, backend.end_capture(), std::move(ended.step_values),
                                        std::move(ended.operands));
}

bool capturing(Device device) { return active && active->device == device; }

void set_step_scalar(const Tensor& scalar, std::function<float()> value) {
  COHORT_CHECK(scalar.defined() && scalar.dtype() == DType::Float32 && scalar.numel() == 1,
               "set_step_scalar: takes a float32 scalar (ops::scalar), got {}",
               scalar.defined() ? fmt::format("{} {}", dtype_name(scalar.dtype()), scalar.shape()) : "an undefined tensor");
  set_step_value("set_step_scalar", scalar, [value = std::move(value)] {
    return static_cast<std::uint64_t>(std::bit_cast<std::uint32_t>(value()));
  });
}

void set_step_counter(const Tensor& counter, std::function<std::uint64_t()> value) {
  COHORT_CHECK(counter.defined() && counter.dtype() == DType::Int32 && counter.shape() == Shape{2},
               "set_step_counter: takes a step counter, int32 (2) (ops::step_counter), got {}",
               counter.defined() ? fmt::format("{} {}", dtype_name(counter.dtype()), counter.shape())
                                 : "an undefined tensor");
  set_step_value("set_step_counter", counter, std::move(value));
}

}  // namespace ops
}  // namespace cohort
