#pragma once
// The memory behind tensors: one allocation from a device's allocator, shared by every view of it.
#include <atomic>
#include <cstddef>

#include "cohort/tensor/allocator.hpp"

namespace cohort {

class Storage {
 public:
  Storage(std::size_t bytes, Device device, Allocator& allocator)
      : data_(static_cast<std::byte*>(allocator.allocate(bytes))), bytes_(bytes), device_(device), allocator_(allocator) {}
  ~Storage() { allocator_.deallocate(data_, bytes_); }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  std::byte* data() const { return data_; }
  Device device() const { return device_; }
  // Asynchronous copies that read from (write into) this storage and have not been synchronized yet.
  std::atomic<int>& copies_reading() { return copies_reading_; }
  std::atomic<int>& copies_writing() { return copies_writing_; }
  bool copy_in_flight() const { return copies_reading_.load() > 0 || copies_writing_.load() > 0; }

 private:
  std::byte* data_;
  std::size_t bytes_;
  Device device_;
  Allocator& allocator_;
  std::atomic<int> copies_reading_{0}, copies_writing_{0};
};

}  // namespace cohort
