#pragma once
// Allocator: where a device's tensor storage comes from. Every device has one (its backend's); host
// memory also has a pinned allocator for the staging buffers of copies to and from a device.
//   HostAllocator     64-byte aligned host memory.
//   CachingAllocator  keeps freed blocks in size-class bins and hands them out again, so that a training
//                     step that allocates the same buffers every time costs no device allocation after
//                     the first; release_cached() returns the cached blocks to the allocator below. A private
//                     pool keeps the blocks of captured work (tensor/capture.hpp) for that work alone.
// Statistics: bytes in use (size-class rounded), the peak of that, and bytes cached.
//
//   const AllocatorStats s = allocator_for(Device::Emulated).stats();
//   fmt::print("{} in use, peak {}, cached {}\n", s.in_use, s.peak, s.cached);

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cohort/core/device.hpp"

namespace cohort {

struct AllocatorStats {
  std::size_t in_use = 0;     // bytes handed out and not yet returned
  std::size_t peak = 0;       // the most in_use has ever been
  std::size_t cached = 0;     // bytes kept for reuse (caching allocators)
  std::int64_t allocations = 0;      // calls to allocate()
  std::int64_t upstream_allocations = 0;  // of those, served by the allocator below (cache misses)
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual std::string name() const = 0;
  // Never returns null; out of memory is a DeviceError naming the bytes and this allocator's statistics.
  virtual void* allocate(std::size_t bytes) = 0;
  // `bytes` is what allocate() was asked for.
  virtual void deallocate(void* pointer, std::size_t bytes) noexcept = 0;
  virtual AllocatorStats stats() const = 0;
  // Starts the peak over from what is in use now (torch.cuda.reset_peak_memory_stats): the peak of a step.
  virtual void reset_peak() = 0;
  virtual void release_cached() {}
};

class HostAllocator : public Allocator {
 public:
  static constexpr std::size_t kAlignment = 64;
  // Beyond `capacity` bytes in use an allocation fails as a device's does (the emulated device's memory).
  explicit HostAllocator(std::string name = "host", std::size_t capacity = std::numeric_limits<std::size_t>::max())
      : name_(std::move(name)), capacity_(capacity) {}
  std::string name() const override { return name_; }
  void* allocate(std::size_t bytes) override;
  void deallocate(void* pointer, std::size_t bytes) noexcept override;
  AllocatorStats stats() const override;
  void reset_peak() override;

 private:
  std::string name_;
  std::size_t capacity_;
  mutable std::mutex mutex_;
  AllocatorStats stats_;
};

class CachingAllocator : public Allocator {
 public:
  explicit CachingAllocator(std::unique_ptr<Allocator> upstream);
  ~CachingAllocator() override;
  std::string name() const override;
  void* allocate(std::size_t bytes) override;
  void deallocate(void* pointer, std::size_t bytes) noexcept override;
  AllocatorStats stats() const override;
  void reset_peak() override;
  void release_cached() override;

  // The bin a request of `bytes` is served from: 512-byte steps up to 4 KiB, then four classes per
  // power of two (at most 25 % of a block unused).
  static std::size_t size_class(std::size_t bytes);

  // From now until end_private_pool(), every block handed out to the calling thread belongs to a new pool: work
  // it captures meanwhile reads and writes those blocks at each replay, so once freed they are handed out again
  // only within that capture, never to other tensors, until the returned hold is gone (the captured work with
  // it). One pool at a time; meanwhile no cached block goes back to the allocator below (an allocation that
  // does not fit fails instead). Blocks still in use when the hold goes are this allocator's again once freed.
  std::shared_ptr<void> begin_private_pool();
  void end_private_pool();

 private:
  struct PrivatePool;
  void release_cached_locked() noexcept;
  void drop_pool(PrivatePool* pool) noexcept;

  std::unique_ptr<Allocator> upstream_;
  mutable std::mutex mutex_;
  std::map<std::size_t, std::vector<void*>> bins_;
  AllocatorStats stats_;
  std::shared_ptr<PrivatePool> filling_;                   // the pool of the capture under way
  std::thread::id filling_thread_;                         // and the thread capturing
  std::map<void*, std::shared_ptr<PrivatePool>> owners_;  // the pool each block handed out during a capture is in
};

// The allocator of a device's backend; DeviceError for a device this build has no backend for.
Allocator& allocator_for(Device device);
// Page-locked host memory for copies to and from a device (plain host memory where no GPU backend is
// present).
Allocator& pinned_host_allocator();

}  // namespace cohort
