// The one place that maps a device to its backend.
#include "tensor/backend.hpp"

#include <mutex>
#include <optional>

#include "cohort/core/check.hpp"
#include "cohort/core/settings.hpp"
#include "cohort/tensor/devices.hpp"
#include "tensor/cpu/cpu_backend.hpp"
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
      // The CPU kernels on storage of its own, drawn through a caching allocator as a GPU's would be.
      static auto* emulated = new cpu::CpuBackend(
          Device::Emulated, std::make_unique<CachingAllocator>(std::make_unique<HostAllocator>("emulated")));
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

struct Tf32Choice {
  std::mutex mutex;
  std::optional<bool> chosen;  // by allow_tf32()
  bool taken = false;          // by the GPU backend

  bool allowed() const { return chosen.value_or(switch_setting("COHORT_ALLOW_TF32").value_or(true)); }
};

Tf32Choice& tf32_choice() {
  static auto* choice = new Tf32Choice();
  return *choice;
}

}  // namespace

void allow_tf32(bool allowed) {
  Tf32Choice& choice = tf32_choice();
  const std::lock_guard lock(choice.mutex);
  if (choice.taken && allowed != choice.allowed())
    throw InvalidArgument(fmt::format("allow_tf32({}): the GPU already computes with TF32 {}; choose before its first use "
                                      "(or set COHORT_ALLOW_TF32)",
                                      allowed, choice.allowed() ? "allowed" : "off (strict FP32)"));
  choice.chosen = allowed;
}

bool tf32_allowed() {
  Tf32Choice& choice = tf32_choice();
  const std::lock_guard lock(choice.mutex);
  return choice.allowed();
}

bool tf32_allowed_from_now_on() {
  Tf32Choice& choice = tf32_choice();
  const std::lock_guard lock(choice.mutex);
  choice.taken = true;
  return choice.allowed();
}

Device choose_device(std::string_view name) {
  if (name == "auto") return device_available(Device::CUDA) ? Device::CUDA : Device::CPU;
  const std::optional<Device> device = parse_device(name);
  if (!device) throw InvalidArgument(fmt::format("unknown device '{}': use cpu, cuda, emulated or auto", name));
  if (!device_available(*device)) backend_for(*device);  // throws the reason
  return *device;
}

}  // namespace cohort
