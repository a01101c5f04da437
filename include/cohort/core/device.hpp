#pragma once
// Where a tensor's storage lives and whose backend computes on it. Ops dispatch on it; layer code never does.
//   CPU       host memory, the CPU kernels.
//   Emulated  the CPU kernels on storage of its own that host code may not touch: it stands in for an
//             accelerator in CPU-only tests, so that a missing transfer or a host access on a device path
//             fails there (DeviceError) instead of on a GPU.
//   CUDA      the process's current NVIDIA GPU (CUDA_VISIBLE_DEVICES picks it), when the build has CUDA.

#include <optional>
#include <string_view>

namespace cohort {

enum class Device { CPU, Emulated, CUDA };

constexpr std::string_view device_name(Device device) {
  switch (device) {
    case Device::CPU: return "cpu";
    case Device::Emulated: return "emulated";
    case Device::CUDA: return "cuda";
  }
  return "unknown";
}

// "cpu", "emulated" or "cuda"; nullopt for anything else.
constexpr std::optional<Device> parse_device(std::string_view name) {
  for (Device d : {Device::CPU, Device::Emulated, Device::CUDA})
    if (device_name(d) == name) return d;
  return std::nullopt;
}

}  // namespace cohort
