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

std::string DeviceAllocator::name() const { return fmt::format("cuda:{}", ordinal_); }

void* DeviceAllocator::allocate(std::size_t bytes) {
  COHORT_CUDA_CHECK(cudaSetDevice(ordinal_), "selecting cuda:{} to allocate {} bytes", ordinal_, bytes);
  void* pointer = nullptr;
  const cudaError_t status = cudaMalloc(&pointer, bytes == 0 ? 1 : bytes);
  std::lock_guard lock(mutex_);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    std::size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    throw DeviceError(fmt::format("{} allocator: out of memory allocating {} bytes ({}; the GPU has {} of {} bytes free)",
                                  name(), bytes, describe_stats(stats_), free, total));
  }
  COHORT_CUDA_CHECK(status, "allocating {} bytes on {} ({})", bytes, name(), describe_stats(stats_));
  stats_.in_use += bytes;
  stats_.peak = std::max(stats_.peak, stats_.in_use);
  ++stats_.allocations;
  ++stats_.upstream_allocations;
  return pointer;
}

void DeviceAllocator::deallocate(void* pointer, std::size_t bytes) noexcept {
  cudaSetDevice(ordinal_);
  cudaFree(pointer);
  std::lock_guard lock(mutex_);
  stats_.in_use -= bytes;
}

AllocatorStats DeviceAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void* PinnedAllocator::allocate(std::size_t bytes) {
  COHORT_CUDA_CHECK(cudaSetDevice(ordinal_), "selecting cuda:{} to allocate {} pinned bytes", ordinal_, bytes);
  void* pointer = nullptr;
  const cudaError_t status = cudaHostAlloc(&pointer, bytes == 0 ? 1 : bytes, cudaHostAllocPortable);
  std::lock_guard lock(mutex_);
  COHORT_CUDA_CHECK(status, "allocating {} bytes of pinned host memory ({})", bytes, describe_stats(stats_));
  stats_.in_use += bytes;
  stats_.peak = std::max(stats_.peak, stats_.in_use);
  ++stats_.allocations;
  ++stats_.upstream_allocations;
  return pointer;
}

void PinnedAllocator::deallocate(void* pointer, std::size_t bytes) noexcept {
  cudaSetDevice(ordinal_);
  cudaFreeHost(pointer);
  std::lock_guard lock(mutex_);
  stats_.in_use -= bytes;
}

AllocatorStats PinnedAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

Scratch::Scratch(Allocator& allocator, std::size_t bytes)
    : allocator_(allocator), bytes_(bytes), pointer_(bytes == 0 ? nullptr : allocator.allocate(bytes)) {}

Scratch::~Scratch() {
  if (pointer_ != nullptr) allocator_.deallocate(pointer_, bytes_);
}

}  // namespace cohort::cuda
