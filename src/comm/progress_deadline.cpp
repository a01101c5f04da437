#include "cohort/comm/progress_deadline.hpp"

#include <fmt/format.h>

namespace cohort::comm {

bool ProgressDeadline::await(const WorkPtr& work, std::chrono::milliseconds limit, std::shared_ptr<void> buffer) {
  const auto since = Clock::now();
  if (!work->wait_for(limit)) {
    keep_until_exit(std::move(buffer));
    return false;
  }
  observe(Clock::now() - since);
  return true;
}

bool await_peer(Transport& transport, int peer, const WorkPtr& work, std::uint64_t own_progress,
                std::chrono::milliseconds limit, std::shared_ptr<void> buffer) {
  struct Waiting {  // reported for the wait alone, also when it throws
    Transport& transport;
    std::uint64_t progress;
    ~Waiting() { transport.report_progress(progress); }
  } waiting{transport, own_progress};
  const std::uint64_t waiting_mark = (own_progress & ((1ull << kWaitTickShift) - 1)) | kWaitingOnPeer;
  std::uint64_t tick = 0;
  transport.report_progress(waiting_mark);
  ProgressWatch watch(transport, peer);
  const auto poll = std::clamp(limit / 20, std::chrono::milliseconds(10), std::chrono::milliseconds(250));
  while (!work->wait_for(poll)) {
    tick = (tick + 1) % (kWaitingOnPeer >> kWaitTickShift);
    transport.report_progress(waiting_mark | tick << kWaitTickShift);
    if (watch.idle() > limit) {
      keep_until_exit(std::move(buffer));
      return false;
    }
  }
  return true;
}

std::string stuck_message(std::string_view stuck, std::string_view what, std::chrono::milliseconds limit) {
  return fmt::format("{}: connected, but {} within {:.1f} s (COHORT_TIMEOUT bounds a process's longest pause)", stuck, what,
                     static_cast<double>(limit.count()) / 1000.0);
}

}  // namespace cohort::comm
