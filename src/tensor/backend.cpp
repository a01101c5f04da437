// The one place that maps a device to its backend.
#include "tensor/backend.hpp"

#include <limits>
#include <mutex>
#include <optional>

#include "cohort/core/check.hpp"
#include "cohort/core/settings.hpp"
#include "cohort/tensor/devices.hpp"
#include "tensor/cpu/cpu_backend.hpp"
#include "tensor/cpu/recording_backend.hpp"
#include "tensor/cuda/cuda_plugin.hpp"

namespace cohort {

// Backends are never destroyed: a tensor in a static object may release its storage after every
// function-local static is gone.
Backend& backend_for(Device device) {
  switch (device) {
    case Device::CPU: {
      static auto* cpu = new cpu::CpuBackend(Device::CPU, std::make_unique<HostAllocator>("host"));
      return *cpu;
    }
    case Device::Emulated: {
      // The CPU kernels on storage of its own, drawn through a caching allocator as a GPU's would be, and a
      // GPU's capture of work.
      static auto* emulated = new cpu::RecordingBackend(std::make_unique<cpu::CpuBackend>(
          Device::Emulated,
          std::make_unique<CachingAllocator>(std::make_unique<HostAllocator>(
              "emulated", static_cast<std::size_t>(count_setting("COHORT_EMULATED_MEMORY", kEmulatedMemoryMeaning)
                                                        .value_or(std::numeric_limits<std::int64_t>::max()))))));
      return *emulated;
    }
    case Device::CUDA: {
      std::string why_not;
      if (const cuda::CudaPlugin* plugin = cuda::cuda_plugin(why_not)) return plugin->backend();
      throw DeviceError(why_not);
    }
  }
  throw DeviceError(fmt::format("no backend for device {}", static_cast<int>(device)));
}

Allocator& allocator_for(Device device) { return backend_for(device).allocator(); }

Allocator& pinned_host_allocator() {
  // Page-locked once this process has used its GPU; a CPU-only process never creates a CUDA context.
  if (const cuda::CudaPlugin* plugin = cuda::cuda_plugin_if_loaded())
    if (Allocator* pinned = plugin->pinned_allocator()) return *pinned;
  static auto* plain = new HostAllocator("pinned host (plain host memory: no GPU in use)");
  return *plain;
}

bool device_available(Device device) {
  switch (device) {
    case Device::CPU:
    case Device::Emulated:
      return true;
    case Device::CUDA: {
      std::string why_not;
      const cuda::CudaPlugin* plugin = cuda::cuda_plugin(why_not);
      return plugin != nullptr && plugin->device_visible();
    }
  }
  return false;
}

std::string kernels_for(Device device, DType type) { return backend_for(device).kernels_for(type); }

std::string device_unavailable_reason(Device device) {
  if (device_available(device)) return {};
  try {
    backend_for(device);
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

int cuda_device_index() {
  std::string why_not;
  if (const cuda::CudaPlugin* plugin = cuda::cuda_plugin(why_not)) return plugin->ordinal();
  throw DeviceError(why_not);
}

namespace {

// One of the GPU's choices: set by its function, else by its environment variable, else on.
struct GpuChoice {
  const char* variable;
  std::optional<bool> chosen;

  bool value() const { return chosen.value_or(switch_setting(variable).value_or(true)); }
};

struct GpuChoiceState {
  std::mutex mutex;
  GpuChoice tf32{"COHORT_ALLOW_TF32", {}}, deterministic{"COHORT_DETERMINISTIC", {}};
  bool taken = false;  // by the GPU backend
};

GpuChoiceState& gpu_choices() {
  static auto* state = new GpuChoiceState();
  return *state;
}

// Sets `choice` to `wanted` unless the GPU took another value; `described(value)` says what a value means.
template <class Describe>
void choose(GpuChoice GpuChoiceState::*member, bool wanted, const char* call, Describe&& described) {
  GpuChoiceState& state = gpu_choices();
  const std::lock_guard lock(state.mutex);
  GpuChoice& choice = state.*member;
  if (state.taken && wanted != choice.value())
    throw InvalidArgument(fmt::format("{}({}): the GPU already computes with {}; choose before its first use (or set {})",
                                      call, wanted, described(choice.value()), choice.variable));
  choice.chosen = wanted;
}

bool value_of(GpuChoice GpuChoiceState::*member) {
  GpuChoiceState& state = gpu_choices();
  const std::lock_guard lock(state.mutex);
  return (state.*member).value();
}

}  // namespace

void allow_tf32(bool allowed) {
  choose(&GpuChoiceState::tf32, allowed, "allow_tf32",
         [](bool value) { return value ? "TF32 allowed" : "TF32 off (strict FP32)"; });
}

bool tf32_allowed() { return value_of(&GpuChoiceState::tf32); }

void use_deterministic_algorithms(bool deterministic) {
  choose(&GpuChoiceState::deterministic, deterministic, "use_deterministic_algorithms",
         [](bool value) { return value ? "deterministic algorithms" : "the fastest algorithms"; });
}

bool deterministic_algorithms() { return value_of(&GpuChoiceState::deterministic); }

GpuChoices gpu_choices_from_now_on() {
  GpuChoiceState& state = gpu_choices();
  const std::lock_guard lock(state.mutex);
  state.taken = true;
  return {state.tf32.value(), state.deterministic.value()};
}

Device choose_device(std::string_view name) {
  if (name == "auto") return device_available(Device::CUDA) ? Device::CUDA : Device::CPU;
  const std::optional<Device> device = parse_device(name);
  if (!device) throw InvalidArgument(fmt::format("unknown device '{}': use cpu, cuda, emulated or auto", name));
  if (!device_available(*device)) backend_for(*device);  // throws the reason
  return *device;
}

}  // namespace cohort
