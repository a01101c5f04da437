#pragma once
// The thread capturing work on a device, from a backend's begin_capture() to its end_capture(). A GPU captures
// its stream, not the thread, so other threads' ops must not be queued while a capture is under way: they
// would join the recording instead of running. Each op of a thread that does not capture is queued inside an
// OpScope; a capture begins once the scopes under way have ended, and no scope begins while a capture is
// under way or waits to begin. A capture records without running the work, in milliseconds, so those waits
// are short; the capturing thread must not wait on the threads that wait for it. The capturing thread's own
// host waits are refused (the recording cannot wait). Each backend that captures holds one; the emulated
// device does what CUDA does.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cohort/core/error.hpp"

namespace cohort {

class CapturingThread {
 public:
  // Held while a thread that does not capture queues an op; holds nothing on the capturing thread and within
  // another scope of the same thread. It stays on the thread that made it: it can be neither copied nor moved.
  class OpScope {
   public:
    OpScope() = default;
    OpScope(const OpScope&) = delete;
    OpScope& operator=(const OpScope&) = delete;
    ~OpScope() {
      if (owner_ != nullptr) owner_->leave_op();
    }

   private:
    friend class CapturingThread;
    explicit OpScope(const CapturingThread* owner) : owner_(owner) {}
    const CapturingThread* owner_ = nullptr;
  };

  // `longest_wait`: how long an op waits for a capture, or a capture for the ops under way, before it fails;
  // a wait that long means the other side waits on this thread.
  explicit CapturingThread(std::chrono::milliseconds longest_wait = std::chrono::seconds(60)) : longest_wait_(longest_wait) {}

  // How errors name the device ("cuda:0", "emulated"), set once the backend knows it.
  void name_device(std::string device) { device_ = std::move(device); }

  // Queues an op from this thread once no other thread captures: see the comment above.
  [[nodiscard]] OpScope enter_op() const {
    if (is_this_thread() || in_scope()) return OpScope();
    std::unique_lock lock(mutex_);
    if (!changed_.wait_for(lock, longest_wait_, [&] { return idle_for_ops(); }))
      throw DeviceError(fmt::format("{} has been capturing another thread's work for more than {} s: an op of this "
                                    "thread waits for that capture to end, as it would otherwise join the recording; "
                                    "does the capturing thread wait on this one?",
                                    device_, seconds(longest_wait_)));
    scopes_of_this_thread().push_back(this);  // first: it may throw
    ++ops_under_way_;
    return OpScope(this);
  }

  // The calling thread captures from now on, once another thread's capture and the other threads' ops under
  // way have ended (each wait bounded by the longest wait); DeviceError where this thread captures already
  // (captures do not nest) or is inside an op.
  void claim() {
    if (is_this_thread()) throw DeviceError(fmt::format("a capture is already under way on {}", device_));
    if (in_scope()) throw DeviceError(fmt::format("a capture on {} cannot begin inside an op", device_));
    std::unique_lock lock(mutex_);
    if (!changed_.wait_for(lock, longest_wait_, [&] { return idle_for_ops(); }))
      throw DeviceError(fmt::format("{} has been capturing another thread's work for more than {} s: this thread's "
                                    "capture waits for it to end",
                                    device_, seconds(longest_wait_)));
    capture_waiting_ = true;
    if (!changed_.wait_for(lock, longest_wait_, [&] { return ops_under_way_ == 0; })) {
      capture_waiting_ = false;
      changed_.notify_all();
      throw DeviceError(fmt::format("an op of another thread on {} has been under way for more than {} s: a capture "
                                    "waits for the ops under way to be queued first",
                                    device_, seconds(longest_wait_)));
    }
    capture_waiting_ = false;
    thread_.store(std::this_thread::get_id());
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
    changed_.notify_all();
  }

  bool is_this_thread() const { return thread_.load() == std::this_thread::get_id(); }
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
  static double seconds(std::chrono::milliseconds wait) { return std::chrono::duration<double>(wait).count(); }
  // The devices whose scopes this thread holds (a thread may hold scopes of two devices at once).
  static std::vector<const CapturingThread*>& scopes_of_this_thread() {
    thread_local std::vector<const CapturingThread*> scopes;
    return scopes;
  }
  bool in_scope() const {
    const auto& scopes = scopes_of_this_thread();
    return std::find(scopes.begin(), scopes.end(), this) != scopes.end();
  }
  // No capture is under way or waiting to begin. Call under the mutex.
  bool idle_for_ops() const { return thread_.load() == std::thread::id{} && !capture_waiting_; }
  void leave_op() const {
    auto& scopes = scopes_of_this_thread();
    if (const auto found = std::find(scopes.begin(), scopes.end(), this); found != scopes.end()) scopes.erase(found);
    {
      const std::lock_guard lock(mutex_);
      --ops_under_way_;
    }
    changed_.notify_all();
  }

  std::string device_;
  std::chrono::milliseconds longest_wait_;
  std::atomic<std::thread::id> thread_{};
  mutable std::mutex mutex_;  // guards the counts below and the start and end of a capture
  mutable std::condition_variable changed_;
  mutable int ops_under_way_ = 0;  // scopes of threads that do not capture
  bool capture_waiting_ = false;   // a claim waits for the ops under way
};

}  // namespace cohort
