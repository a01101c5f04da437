#include "cohort/tensor/allocator.hpp"

#include <bit>
#include <cstdlib>
#include <limits>
#include <new>

#include "cohort/core/check.hpp"

namespace cohort {
namespace {

std::string describe(const AllocatorStats& s) {
  return fmt::format("{} bytes in use, peak {}, {} cached", s.in_use, s.peak, s.cached);
}

void count_allocation(AllocatorStats& stats, std::size_t bytes) {
  stats.in_use += bytes;
  stats.peak = std::max(stats.peak, stats.in_use);
  ++stats.allocations;
}

}  // namespace

void* HostAllocator::allocate(std::size_t bytes) {
  if (bytes > std::numeric_limits<std::size_t>::max() / 2)
    throw DeviceError(fmt::format("{} allocator: cannot allocate {} bytes", name_, bytes));
  // aligned_alloc needs a size that is a multiple of the alignment; never ask for zero bytes.
  const std::size_t rounded = std::max(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
  std::lock_guard lock(mutex_);
  if (bytes > capacity_ - std::min(capacity_, stats_.in_use))
    throw DeviceError(fmt::format("{} allocator: out of memory allocating {} bytes ({}; its capacity is {} bytes)", name_,
                                  bytes, describe(stats_), capacity_));
  void* memory = std::aligned_alloc(kAlignment, rounded);
  if (memory == nullptr)
    throw DeviceError(fmt::format("{} allocator: out of memory allocating {} bytes ({})", name_, bytes, describe(stats_)));
  count_allocation(stats_, bytes);
  ++stats_.upstream_allocations;
  return memory;
}

void HostAllocator::deallocate(void* pointer, std::size_t bytes) noexcept {
  std::free(pointer);
  std::lock_guard lock(mutex_);
  stats_.in_use -= bytes;
}

AllocatorStats HostAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void HostAllocator::reset_peak() {
  std::lock_guard lock(mutex_);
  stats_.peak = stats_.in_use;
}

CachingAllocator::CachingAllocator(std::unique_ptr<Allocator> upstream) : upstream_(std::move(upstream)) {
  COHORT_CHECK(upstream_ != nullptr, "a caching allocator needs an allocator to draw from");
}

CachingAllocator::~CachingAllocator() { release_cached_locked(); }

std::string CachingAllocator::name() const { return "caching " + upstream_->name(); }

std::size_t CachingAllocator::size_class(std::size_t bytes) {
  constexpr std::size_t kSmallStep = 512, kSmallLimit = 4096;
  // Beyond this a class would not fit in size_t; no device has that much memory anyway.
  if (bytes > std::numeric_limits<std::size_t>::max() / 2)
    throw DeviceError(fmt::format("cannot allocate {} bytes: more than any device holds", bytes));
  if (bytes <= kSmallLimit) return std::max(kSmallStep, (bytes + kSmallStep - 1) / kSmallStep * kSmallStep);
  // Four classes between consecutive powers of two: 4096, 5120, 6144, 7168, 8192, 10240, ...
  const std::size_t power = std::bit_floor(bytes);
  const std::size_t step = power / 4;
  return (bytes + step - 1) / step * step;
}

void* CachingAllocator::allocate(std::size_t bytes) {
  const std::size_t size = size_class(bytes);
  std::lock_guard lock(mutex_);
  auto& bin = bins_[size];
  void* block = nullptr;
  if (!bin.empty()) {
    block = bin.back();
    bin.pop_back();
    stats_.cached -= size;
  } else {
    try {
      block = upstream_->allocate(size);
    } catch (const DeviceError&) {
      // Out of memory with blocks of other sizes cached: return them and try once more.
      release_cached_locked();
      try {
        block = upstream_->allocate(size);
      } catch (const DeviceError&) {
        throw DeviceError(fmt::format("{} allocator: out of memory allocating {} bytes ({}, after returning the cached "
                                      "blocks)",
                                      name(), bytes, describe(stats_)));
      }
    }
    ++stats_.upstream_allocations;
  }
  count_allocation(stats_, size);
  return block;
}

void CachingAllocator::deallocate(void* pointer, std::size_t bytes) noexcept {
  const std::size_t size = size_class(bytes);
  std::lock_guard lock(mutex_);
  try {
    bins_[size].push_back(pointer);
  } catch (const std::bad_alloc&) {
    upstream_->deallocate(pointer, size);  // no room to remember it: give it back
    stats_.in_use -= size;
    return;
  }
  stats_.in_use -= size;
  stats_.cached += size;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard lock(mutex_);
  stats_.peak = stats_.in_use;
}

void CachingAllocator::release_cached() {
  std::lock_guard lock(mutex_);
  release_cached_locked();
}

void CachingAllocator::release_cached_locked() noexcept {
  for (auto& [size, blocks] : bins_) {
    for (void* block : blocks) upstream_->deallocate(block, size);
    stats_.cached -= size * blocks.size();
    blocks.clear();
  }
}

}  // namespace cohort
