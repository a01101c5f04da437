// Device and pinned host memory for the CUDA backend, and per-call scratch blocks.
#include <fmt/format.h>

#include "cuda_backend.hpp"
#include "cuda_check.hpp"

namespace cohort::cuda {
namespace {

std::string describe_stats(const AllocatorStats& s) {
  return fmt::format("{} bytes in use, peak {}, {} allocations", s.in_use, s.peak, s.allocations);
}

}  // namespace

std::string CudaAllocator::name() const {
  return memory_ == Memory::Device ? fmt::format("cuda:{}", ordinal_) : std::string("pinned host");
}

void* CudaAllocator::allocate(std::size_t bytes) {
  COHORT_CUDA_CHECK(cudaSetDevice(ordinal_), "selecting cuda:{} to allocate {} bytes", ordinal_, bytes);
  void* pointer = nullptr;
  const std::size_t asked = bytes == 0 ? 1 : bytes;
  // While this thread captures work, stream capture counts cudaMalloc as unsafe: the recording could not replay
  // an allocation. A block handed out then stays the recording's (the caching allocator's private pool), so the
  // call is let through, as PyTorch's allocator does.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  const cudaError_t status =
      memory_ == Memory::Device ? cudaMalloc(&pointer, asked) : cudaHostAlloc(&pointer, asked, cudaHostAllocPortable);
  cudaThreadExchangeStreamCaptureMode(&mode);
  std::lock_guard lock(mutex_);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    std::size_t free = 0, total = 0;
    if (memory_ == Memory::Device) cudaMemGetInfo(&free, &total);
    throw DeviceError(fmt::format("{} allocator: out of memory allocating {} bytes ({}{})", name(), bytes,
                                  describe_stats(stats_),
                                  memory_ == Memory::Device ? fmt::format("; the GPU has {} of {} bytes free", free, total)
                                                            : std::string()));
  }
  COHORT_CUDA_CHECK(status, "allocating {} bytes of {} memory ({})", bytes, name(), describe_stats(stats_));
  stats_.in_use += bytes;
  stats_.peak = std::max(stats_.peak, stats_.in_use);
  ++stats_.allocations;
  ++stats_.upstream_allocations;
  return pointer;
}

void CudaAllocator::deallocate(void* pointer, std::size_t bytes) noexcept {
  cudaSetDevice(ordinal_);
  if (memory_ == Memory::Device) cudaFree(pointer);
  else cudaFreeHost(pointer);
  std::lock_guard lock(mutex_);
  stats_.in_use -= bytes;
}

AllocatorStats CudaAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void CudaAllocator::reset_peak() {
  std::lock_guard lock(mutex_);
  stats_.peak = stats_.in_use;
}

Scratch::Scratch(Allocator& allocator, std::size_t bytes)
    : allocator_(allocator), bytes_(bytes), pointer_(bytes == 0 ? nullptr : allocator.allocate(bytes)) {}

Scratch::~Scratch() {
  if (pointer_ != nullptr) allocator_.deallocate(pointer_, bytes_);
}

}  // namespace cohort::cuda
