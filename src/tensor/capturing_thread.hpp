#pragma once
// The thread capturing work on a device, from a backend's begin_capture() to its end_capture(). A GPU captures
// its stream, not the thread, so while one thread captures, other threads' ops on the device are refused (they
// would join the recording instead of running), and so are the capturing thread's own host waits (the
// recording cannot wait). Each backend that captures holds one; the emulated device refuses what CUDA refuses.
#include <fmt/format.h>

#include <atomic>
#include <string>
#include <thread>

#include "cohort/core/error.hpp"

namespace cohort {

class CapturingThread {
 public:
  // How errors name the device ("cuda:0", "emulated"), set once the backend knows it.
  void name_device(std::string device) { device_ = std::move(device); }

  // The calling thread captures from now on; DeviceError where a capture is under way already.
  void claim() {
    std::thread::id none{};
    if (!thread_.compare_exchange_strong(none, std::this_thread::get_id()))
      throw DeviceError(fmt::format("a capture is already under way on {}", device_));
  }
  // DeviceError unless the calling thread captures; `release` ends its capture.
  void check_claimed() const {
    if (!is_this_thread()) throw DeviceError(fmt::format("no capture of this thread is under way on {}", device_));
  }
  void release() { thread_.store(std::thread::id{}); }

  bool is_this_thread() const { return thread_.load() == std::this_thread::get_id(); }
  // DeviceError while another thread captures.
  void refuse_other_threads() const {
    const std::thread::id capturing = thread_.load();
    if (capturing != std::thread::id{} && capturing != std::this_thread::get_id()) [[unlikely]]
      throw DeviceError(fmt::format("{} is capturing another thread's work: an op queued on it now would join that "
                                    "recording instead of running; queue it once the capture has ended",
                                    device_));
  }
  // DeviceError naming `op`, which makes the host wait, while the calling thread captures.
  void refuse_host_wait(const char* op) const {
    if (is_this_thread()) [[unlikely]]
      throw DeviceError(fmt::format("{} cannot be captured on {}: it makes the host wait for the device", op, device_));
  }

 private:
  std::string device_;
  std::atomic<std::thread::id> thread_{};
};

}  // namespace cohort
