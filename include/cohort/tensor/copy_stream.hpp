#pragma once
// CopyStream: an ordered queue of asynchronous copies on one device's stream, for overlapping transfers
// (the next batch to the GPU) with computation. Until synchronize() returns, both sides of every queued
// copy are in flight: an op that uses them, host access, or a to()/clone() of them is a DeviceError, so a
// copy can never be read half-done; another copy may read a source, but nothing touches a destination.
//
//   CopyStream stream(Device::CUDA);
//   stream.copy(host_batch, device_batch);   // returns at once
//   ...                                      // compute on other tensors meanwhile
//   stream.synchronize();                    // device_batch is ready

#include <memory>
#include <vector>

#include "cohort/tensor/tensor.hpp"

namespace cohort {

class BackendStream;

class CopyStream {
 public:
  explicit CopyStream(Device device);
  ~CopyStream();  // waits for what is queued
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;

  Device device() const { return device_; }
  // Queues source -> destination (same shape; one side on this stream's device, the other there or on the
  // host).
  void copy(const Tensor& source, const Tensor& destination);
  // Waits for every queued copy; rethrows the first failure.
  void synchronize();

 private:
  void release_in_flight() noexcept;

  Device device_;
  std::unique_ptr<BackendStream> stream_;
  struct Queued {
    Tensor source, destination;
  };
  std::vector<Queued> in_flight_;
};

}  // namespace cohort
