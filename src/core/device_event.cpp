#include "cohort/core/device_event.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <thread>

#include "cohort/core/error.hpp"
#include "cohort/core/timeline.hpp"

namespace cohort {

void wait_until_finished(const DeviceEventPtr& event, std::chrono::milliseconds timeout, std::string_view what) {
  if (event == nullptr || event->finished()) return;
  const std::string waiting = fmt::format("{}: waiting for the device to write its buffer", what);
  const timeline::Span span("device", waiting);  // the rest of backward, on the timeline of the reader's thread
  // A bucket's gradients are usually a kernel or two away: look again soon, then less often.
  constexpr std::chrono::microseconds kFirstLook{5}, kLongestSleep{200};
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::chrono::microseconds sleep = kFirstLook;
  while (!event->finished()) {
    if (std::chrono::steady_clock::now() >= deadline)
      throw TimeoutError(fmt::format("{}: the device did not finish the work that writes its buffer within {} ms", what,
                                     timeout.count()));
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, kLongestSleep);
  }
}

}  // namespace cohort
