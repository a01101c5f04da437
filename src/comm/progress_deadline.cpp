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

std::string stuck_message(std::string_view stuck, std::string_view what, std::chrono::milliseconds limit) {
  return fmt::format("{}: connected, but {} within {:.1f} s (COHORT_TIMEOUT bounds a process's longest pause)", stuck, what,
                     static_cast<double>(limit.count()) / 1000.0);
}

}  // namespace cohort::comm
