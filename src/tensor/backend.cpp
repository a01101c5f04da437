// The one place that maps a device to its backend.
#include "tensor/backend.hpp"

#include "cohort/core/check.hpp"
#include "cohort/core/config.hpp"
#include "tensor/cpu/cpu_backend.hpp"

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
      break;
  }
  if (COHORT_HAS_CUDA)
    throw DeviceError(fmt::format("this build of cohort has no {} backend: the CUDA toolkit was found at configure "
                                  "time, but this version of cohort has no CUDA kernels yet; use Device::CPU, or "
                                  "Device::Emulated to check a program's transfers",
                                  device_name(device)));
  throw DeviceError(fmt::format("this build of cohort has no {} backend: configure with -DCOHORT_WITH_CUDA=ON on a "
                                "machine with the CUDA toolkit, cuDNN and cuBLAS",
                                device_name(device)));
}

Allocator& allocator_for(Device device) { return backend_for(device).allocator(); }

Allocator& pinned_host_allocator() {
  // Page-locking needs a GPU runtime; without one, staging buffers are plain host memory.
  static auto* pinned = new HostAllocator("pinned host (plain host memory: no GPU backend)");
  return *pinned;
}

}  // namespace cohort
