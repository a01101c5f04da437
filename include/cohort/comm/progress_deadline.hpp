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
#include <optional>
#include <string>
#include <string_view>

#include "cohort/comm/transport.hpp"
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

// A progress count (Transport::report_progress) with this bit set: the rank is waiting on another process,
// whose progress it judges itself (await_peer), so its own silence is no sign that it is stuck. While it
// waits, the bits from kWaitTickShift up tick every poll: a waiter whose own thread froze stops ticking
// and is judged idle like any other.
inline constexpr std::uint64_t kWaitingOnPeer = 1ull << 63;
inline constexpr int kWaitTickShift = 48;

// Whether a rank that reported `count` (Transport::progress_of) waits on another.
inline bool waits_on_another(std::optional<std::uint64_t> count) { return count && (*count & kWaitingOnPeer) != 0; }

// Waits for `work`, which `peer` is to complete, while this rank reports its `own_progress` with
// kWaitingOnPeer. The wait goes on while `peer`'s count changes or `peer` is itself waiting on another
// (which it judges in turn; the waits of a run form no cycle); it returns false once `peer` has been idle
// (ProgressWatch) for `limit`, and `buffer`, which the receive still posted may yet fill, is kept until
// the process ends.
bool await_peer(Transport& transport, int peer, const WorkPtr& work, std::uint64_t own_progress,
                std::chrono::milliseconds limit, std::shared_ptr<void> buffer);

// How long a peer has shown no progress: its count sampled as often as its waiter likes (a heartbeat
// brings it, so a change shows up to one interval late). A peer that waits on another ticks, so it is not
// idle while its waiting thread runs.
class ProgressWatch {
 public:
  using Clock = std::chrono::steady_clock;
  ProgressWatch(const Transport& transport, int peer)
      : transport_(transport), peer_(peer), seen_(transport.progress_of(peer)), since_(Clock::now()) {}
  Clock::duration idle() {
    const auto count = transport_.progress_of(peer_);
    const auto now = Clock::now();
    if (count != seen_) {
      seen_ = count;
      since_ = now;
    }
    return now - since_;
  }

 private:
  const Transport& transport_;
  int peer_;
  std::optional<std::uint64_t> seen_;
  Clock::time_point since_;
};

// "worker 1 (...) is stuck: connected, but ps 0 got no gradients of step 12 within 15.0 s (...)": `stuck`
// names the processes, each followed by " is stuck"; `what` says what did not happen within `limit`.
std::string stuck_message(std::string_view stuck, std::string_view what, std::chrono::milliseconds limit);

}  // namespace cohort::comm
