#pragma once
// What the rest of the library sees of the CUDA backend: no CUDA header, so backend.cpp and the NCCL
// communicator's callers stay plain C++.
#include "tensor/backend.hpp"

namespace cohort::cuda {

// The process's CUDA backend, made on first use; DeviceError naming the reason when no GPU is visible.
Backend& cuda_backend();
// True when a GPU is visible to this process; never throws.
bool cuda_device_visible();
// The page-locked staging allocator once the process has used its GPU; null before.
Allocator* cuda_pinned_allocator();
// The CUDA ordinal of the backend's GPU (makes the backend).
int cuda_ordinal();

}  // namespace cohort::cuda
