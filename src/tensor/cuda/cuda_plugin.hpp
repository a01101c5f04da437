#pragma once
// What the rest of the library sees of the CUDA backend, which lives in libcohort_cuda.so (core/plugin.hpp):
// its table of entry points. No CUDA header, so backend.cpp stays plain C++ and libcohort needs no CUDA
// library.
#include "core/plugin.hpp"
#include "tensor/backend.hpp"

namespace cohort::cuda {

inline constexpr int kCudaPluginLayout = 2;  // 2: Backend::record_event, copy_to_host_async

struct CudaPlugin {
  PluginHeader header;
  // The process's CUDA backend, made on first use; DeviceError naming the reason when no GPU is visible.
  Backend& (*backend)();
  // True when a GPU is visible to this process; never throws.
  bool (*device_visible)();
  // The page-locked staging allocator once the process has used its GPU; null before.
  Allocator* (*pinned_allocator)();
  // The CUDA ordinal of the backend's GPU (makes the backend).
  int (*ordinal)();
};

// The CUDA backend's table, loaded on first use; null with `why_not` set when this build has no CUDA
// backend or it cannot be loaded here. Never throws.
const CudaPlugin* cuda_plugin(std::string& why_not);
// The table if something has loaded it already, else null: for the questions a CPU-only process asks too,
// which must not load CUDA's libraries.
const CudaPlugin* cuda_plugin_if_loaded();

}  // namespace cohort::cuda
