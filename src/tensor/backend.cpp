// The one place that maps a device to its backend.
#include "tensor/backend.hpp"

#include "cohort/core/check.hpp"
#include "cohort/core/config.hpp"
#include "cohort/tensor/devices.hpp"
#include "tensor/cpu/cpu_backend.hpp"
#if COHORT_HAS_CUDA
#include "tensor/cuda/cuda_entry.hpp"
#endif

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
    case Device::CUDA:
#if COHORT_HAS_CUDA
      return cuda::cuda_backend();
#else
      break;
#endif
  }
  throw DeviceError(fmt::format("this build of cohort has no {} backend: configure with -DCOHORT_WITH_CUDA=ON on a "
                                "machine with the CUDA toolkit, cuDNN and cuBLAS",
                                device_name(device)));
}

Allocator& allocator_for(Device device) { return backend_for(device).allocator(); }

Allocator& pinned_host_allocator() {
#if COHORT_HAS_CUDA
  // Page-locked once this process has used its GPU; a CPU-only process never creates a CUDA context.
  if (Allocator* pinned = cuda::cuda_pinned_allocator()) return *pinned;
#endif
  static auto* plain = new HostAllocator("pinned host (plain host memory: no GPU in use)");
  return *plain;
}

bool device_available(Device device) {
  switch (device) {
    case Device::CPU:
    case Device::Emulated:
      return true;
    case Device::CUDA:
#if COHORT_HAS_CUDA
      return cuda::cuda_device_visible();
#else
      return false;
#endif
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
#if COHORT_HAS_CUDA
  return cuda::cuda_ordinal();
#else
  backend_for(Device::CUDA);  // throws the reason
  return -1;
#endif
}

Device choose_device(std::string_view name) {
  if (name == "auto") return device_available(Device::CUDA) ? Device::CUDA : Device::CPU;
  const std::optional<Device> device = parse_device(name);
  if (!device) throw InvalidArgument(fmt::format("unknown device '{}': use cpu, cuda, emulated or auto", name));
  if (!device_available(*device)) backend_for(*device);  // throws the reason
  return *device;
}

}  // namespace cohort
