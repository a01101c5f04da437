#pragma once
// DeviceEvent: a point in a device's queued work, recorded by the tensor layer (ops::record_event,
// ops::copy_to_host_async) and awaited by whoever reads what that work wrote without stopping the thread
// that queues it: a GPU communicator's stream, a host communicator's thread. A null DeviceEventPtr is a
// point already passed (the device's ops finish before they return).

#include <chrono>
#include <memory>
#include <string_view>

namespace cohort {

class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  // Whether the work before the point has finished; DeviceError where the device failed meanwhile.
  virtual bool finished() const = 0;
  // The cudaEvent_t behind the point, for another stream to wait on; null on other devices.
  virtual void* cuda_event() const { return nullptr; }
};

using DeviceEventPtr = std::shared_ptr<const DeviceEvent>;

// Returns once `event` finished (at once for null); TimeoutError naming `what` when the device has not
// reached it within `timeout`. Polls: a stuck device never hangs the caller.
void wait_until_finished(const DeviceEventPtr& event, std::chrono::milliseconds timeout, std::string_view what);

}  // namespace cohort
