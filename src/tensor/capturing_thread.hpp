#pragma once
// The thread capturing work on a device, from a backend's begin_capture() to its end_capture(). A GPU captures
// its stream, not the thread, so while one thread captures, other threads' ops on the device wait for the
// capture to end (they would join the recording instead of running; a capture records a step without running
// it, in milliseconds), and the capturing thread's own host waits are refused (the recording cannot wait).
// Each backend that captures holds one; the emulated device does what CUDA does.
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "cohort/core/error.hpp"

namespace cohort {

class CapturingThread {
 public:
  // `longest_wait`: how long another thread's op waits for a capture to end before it fails; a capture that
  // lasts this long waits on that thread itself.
  explicit CapturingThread(std::chrono::milliseconds longest_wait = std::chrono::seconds(60)) : longest_wait_(longest_wait) {}

  // How errors name the device ("cuda:0", "emulated"), set once the backend knows it.
  void name_device(std::string device) { device_ = std::move(device); }

  // The calling thread captures from now on, once another thread's capture has ended; DeviceError where this
  // thread captures already (captures do not nest).
  void claim() {
    for (;;) {
      wait_for_other_threads();
      std::thread::id none{};
      if (thread_.compare_exchange_strong(none, std::this_thread::get_id())) return;
      if (none == std::this_thread::get_id()) throw DeviceError(fmt::format("a capture is already under way on {}", device_));
    }
  }
  // DeviceError unless the calling thread captures; `release` ends its capture.
  void check_claimed() const {
    if (!is_this_thread()) throw DeviceError(fmt::format("no capture of this thread is under way on {}", device_));
  }
  void release() {
    {
      const std::lock_guard lock(mutex_);
      thread_.store(std::thread::id{});
    }
    ended_.notify_all();
  }

  bool is_this_thread() const { return thread_.load() == std::this_thread::get_id(); }
  // Waits while another thread captures; DeviceError where that lasts longer than the longest wait.
  void wait_for_other_threads() const {
    if (!another_thread_captures()) [[likely]]
      return;
    std::unique_lock lock(mutex_);
    if (!ended_.wait_for(lock, longest_wait_, [&] { return !another_thread_captures(); }))
      throw DeviceError(fmt::format("{} has been capturing another thread's work for more than {} s: an op of this "
                                    "thread waits for that capture to end, as it would otherwise join the recording; "
                                    "does the capturing thread wait on this one?",
                                    device_, std::chrono::duration<double>(longest_wait_).count()));
  }
  // DeviceError naming `op`, which makes the host wait, while the calling thread captures.
  void refuse_host_wait(const char* op) const {
    if (is_this_thread()) [[unlikely]]
      throw DeviceError(fmt::format("{} cannot be captured on {}: it makes the host wait for the device", op, device_));
  }

  // DeviceError naming `op`, a copy stream's, while the calling thread captures: the copy stream would wait for
  // the recording's work and join the recording, which could then not end.
  void refuse_copy_stream(const char* op) const {
    if (is_this_thread()) [[unlikely]]
      throw DeviceError(fmt::format("{} cannot be captured on {}: a copy stream waits for the device's queued work; copy "
                                    "before the capture or after it",
                                    op, device_));
  }

 private:
  bool another_thread_captures() const {
    const std::thread::id capturing = thread_.load();
    return capturing != std::thread::id{} && capturing != std::this_thread::get_id();
  }

  std::string device_;
  std::chrono::milliseconds longest_wait_;
  std::atomic<std::thread::id> thread_{};
  mutable std::mutex mutex_;  // guards the end of a capture for the threads waiting on it
  mutable std::condition_variable ended_;
};

}  // namespace cohort
