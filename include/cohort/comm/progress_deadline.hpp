#pragma once
// ProgressDeadline: how long a process may wait for another one's progress (its next request, its
// gradients, an answer, its share of an agreement) before calling it stuck. A peer that is stuck but
// alive keeps its connection and heartbeats, so the transport never reports it lost; only a bound on
// progress finds it.
//
// The bound is the run's operation deadline (COHORT_TIMEOUT) or kSlack times the longest such wait seen
// so far in the run, whichever is longer: the first steps measure what a legitimate wait is, so a model
// whose steps outgrow the floor is not misjudged, and a stuck peer is named within a few steps' time.
//
//   ProgressDeadline deadline(transport.timeout());
//   auto reply = std::make_shared<Reply>();
//   if (!deadline.await(transport.recv(peer, tag, bytes_of(*reply)), deadline.limit(), reply))
//     throw TimeoutError(stuck_message(transport.describe(peer) + " is stuck", "it did not answer", deadline.limit()));
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "cohort/comm/work.hpp"

namespace cohort::comm {

class ProgressDeadline {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kSlack = 4;

  explicit ProgressDeadline(std::chrono::milliseconds floor) : floor_(floor) {}

  std::chrono::milliseconds limit() const {
    return std::max(floor_, kSlack * std::chrono::milliseconds(longest_ms_.load(std::memory_order_relaxed)));
  }
  // Waits up to `limit` for `work`. In time, the wait counts as legitimate (observe()); past it false, and
  // `buffer`, which the receive still posted may yet fill, is kept until the process ends.
  bool await(const WorkPtr& work, std::chrono::milliseconds limit, std::shared_ptr<void> buffer);
  // A wait that ended in progress; any thread.
  void observe(Clock::duration waited) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(waited).count();
    auto longest = longest_ms_.load(std::memory_order_relaxed);
    while (ms > longest && !longest_ms_.compare_exchange_weak(longest, ms, std::memory_order_relaxed)) {
    }
  }

 private:
  std::chrono::milliseconds floor_;
  std::atomic<std::int64_t> longest_ms_{0};
};

// "worker 1 (...) is stuck: connected, but ps 0 got no gradients of step 12 within 15.0 s (...)": `stuck`
// names the processes, each followed by " is stuck"; `what` says what did not happen within `limit`.
std::string stuck_message(std::string_view stuck, std::string_view what, std::chrono::milliseconds limit);

}  // namespace cohort::comm
