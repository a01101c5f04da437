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
//   const auto started = ProgressDeadline::Clock::now();
//   if (!work->wait_for(deadline.limit())) throw TimeoutError(...);   // the peer is stuck
//   deadline.observe(ProgressDeadline::Clock::now() - started);
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace cohort::comm {

class ProgressDeadline {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kSlack = 4;

  explicit ProgressDeadline(std::chrono::milliseconds floor) : floor_(floor) {}

  std::chrono::milliseconds limit() const {
    return std::max(floor_, kSlack * std::chrono::milliseconds(longest_ms_.load(std::memory_order_relaxed)));
  }
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

// A deadline as error messages give it: "15.0 s".
inline double in_seconds(std::chrono::milliseconds duration) { return static_cast<double>(duration.count()) / 1000.0; }

}  // namespace cohort::comm
