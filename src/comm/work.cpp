#include "cohort/comm/work.hpp"

#include <algorithm>
#include <fmt/format.h>

#include "cohort/core/error.hpp"

namespace cohort::comm {

void Work::wait(std::chrono::milliseconds timeout) {
  if (!wait_for(timeout)) throw TimeoutError(fmt::format("{} did not complete within {} ms", what_, timeout.count()));
}

bool Work::wait_for(std::chrono::milliseconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  Poller* sleeping_from = nullptr;  // told when the sleep after its polls ends
  if (poller_ != nullptr && timeout.count() > 0 && !done()) {
    const auto until = start + std::min<std::chrono::microseconds>(poller_->polling_time(), timeout);
    struct Polling {
      explicit Polling(Poller& poller) : poller(poller) { poller.begin(); }
      ~Polling() { poller.end(finished); }
      Poller& poller;
      bool finished = false;
    } polling(*poller_);
    while (!done() && std::chrono::steady_clock::now() < until) {
      if (!poller_->poll()) break;
      if (!done()) poller_->between_polls();
    }
    polling.finished = done();
    if (!polling.finished) sleeping_from = poller_;
  }
  const struct Woken {
    Poller* poller;
    ~Woken() {
      if (poller != nullptr) poller->slept();
    }
  } woken{sleeping_from};
  const auto left = std::max(start + timeout - std::chrono::steady_clock::now(), std::chrono::steady_clock::duration::zero());
  std::unique_lock lock(mutex_);
  if (!finished_.wait_for(lock, left, [&] { return done_; })) return false;
  if (error_) std::rethrow_exception(error_);
  return true;
}

bool Work::done() const {
  const std::lock_guard lock(mutex_);
  return done_;
}

void Work::complete() {
  {
    const std::lock_guard lock(mutex_);
    if (done_) return;
    done_ = true;
  }
  finished_.notify_all();
}

void Work::fail(std::exception_ptr error) {
  {
    const std::lock_guard lock(mutex_);
    if (done_) return;
    done_ = true;
    error_ = std::move(error);
  }
  finished_.notify_all();
}

void keep_until_exit(std::shared_ptr<void> buffer) {
  static std::mutex mutex;
  static std::vector<std::shared_ptr<void>> kept;
  const std::lock_guard lock(mutex);
  kept.push_back(std::move(buffer));
}

void wait_all(const std::vector<WorkPtr>& works, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const auto& work : works) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    work->wait(std::max(left, std::chrono::milliseconds(0)));
  }
}

}  // namespace cohort::comm
