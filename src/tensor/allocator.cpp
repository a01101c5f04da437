#include "cohort/tensor/allocator.hpp"

#include <bit>
#include <cstdlib>
#include <limits>
#include <new>
#include <thread>

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

// The free blocks a pool keeps for its captured work; `live` while its hold (the work) exists.
struct CachingAllocator::PrivatePool {
  std::map<std::size_t, std::vector<void*>> bins;
  bool live = true;
};

void* CachingAllocator::allocate(std::size_t bytes) {
  const std::size_t size = size_class(bytes);
  std::lock_guard lock(mutex_);
  const bool capturing = filling_ && filling_thread_ == std::this_thread::get_id();
  if (capturing) {
    // A capture reuses the blocks its own work freed before taking any other.
    auto& own = filling_->bins[size];
    if (!own.empty()) {
      void* block = own.back();
      own.pop_back();
      stats_.cached -= size;
      count_allocation(stats_, size);
      return block;
    }
  }
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
      // While a capture is under way no block may go back to the device (a GPU's free would break the capture):
      // the captured step fails and runs op by op.
      if (filling_) throw;
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
  if (capturing) {
    try {
      owners_.emplace(block, filling_);
    } catch (const std::bad_alloc&) {
      upstream_->deallocate(block, size);
      throw DeviceError(fmt::format("{} allocator: no host memory left to record a block of captured work", name()));
    }
  }
  count_allocation(stats_, size);
  return block;
}

void CachingAllocator::deallocate(void* pointer, std::size_t bytes) noexcept {
  const std::size_t size = size_class(bytes);
  std::lock_guard lock(mutex_);
  if (const auto owner = owners_.find(pointer); owner != owners_.end()) {
    PrivatePool& pool = *owner->second;
    if (pool.live) {
      try {
        pool.bins[size].push_back(pointer);
        stats_.in_use -= size;
        stats_.cached += size;
        return;
      } catch (const std::bad_alloc&) {
        // No room to keep it for the pool: it must never serve another tensor while the captured work lives, so it
        // stays out of use for good.
        return;
      }
    }
    owners_.erase(owner);  // the work is gone: an ordinary block again
  }
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

std::shared_ptr<void> CachingAllocator::begin_private_pool() {
  std::lock_guard lock(mutex_);
  if (filling_) throw DeviceError(fmt::format("{} allocator: a private pool is being filled already", name()));
  auto pool = std::make_shared<PrivatePool>();
  filling_ = pool;
  filling_thread_ = std::this_thread::get_id();
  // The hold: when the captured work goes, its pool's free blocks become ordinary cached blocks.
  return std::shared_ptr<void>(pool.get(), [this, pool](void*) { drop_pool(pool.get()); });
}

void CachingAllocator::end_private_pool() {
  std::lock_guard lock(mutex_);
  filling_.reset();
}

void CachingAllocator::drop_pool(PrivatePool* pool) noexcept {
  std::lock_guard lock(mutex_);
  pool->live = false;
  for (auto& [size, blocks] : pool->bins) {
    for (void* block : blocks) {
      owners_.erase(block);
      try {
        bins_[size].push_back(block);
      } catch (const std::bad_alloc&) {
        upstream_->deallocate(block, size);
        stats_.cached -= size;
      }
    }
    blocks.clear();
  }
}

void CachingAllocator::release_cached_locked() noexcept {
  for (auto& [size, blocks] : bins_) {
    for (void* block : blocks) upstream_->deallocate(block, size);
    stats_.cached -= size * blocks.size();
    blocks.clear();
  }
}

}  // namespace cohort
