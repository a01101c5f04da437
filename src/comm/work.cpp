#include "cohort/comm/work.hpp"

#include <algorithm>
#include <fmt/format.h>

#include "cohort/core/error.hpp"

namespace cohort::comm {

std::string name_of(const RankNames& names, int rank) {
  const auto index = static_cast<std::size_t>(rank);
  return names && rank >= 0 && index < names->size() ? (*names)[index] : fmt::format("rank {}", rank);
}

std::string PeerOperation::text() const { return fmt::format("{} {}, tag {}", verb, name_of(names, peer), tag); }

std::string Work::what() const {
  if (const auto* operation = std::get_if<PeerOperation>(&what_)) return operation->text();
  return std::get<std::string>(what_);
}

void Work::wait(std::chrono::milliseconds timeout) {
  if (!wait_for(timeout)) throw TimeoutError(fmt::format("{} did not complete within {} ms", what(), timeout.count()));
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
    // The clock is read every few polls: a read costs as much as a poll that finds nothing.
    constexpr int kPollsPerClockRead = 8;
    for (int polls = 1; !done(); ++polls) {
      if (polls % kPollsPerClockRead == 0 && std::chrono::steady_clock::now() >= until) break;
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
  if (!finished_.wait_for(lock, left, [&] { return done_.load(std::memory_order_relaxed); })) return false;
  if (error_) std::rethrow_exception(error_);
  return true;
}

bool Work::done() const { return done_.load(std::memory_order_acquire); }

void Work::complete() {
  {
    const std::lock_guard lock(mutex_);
    if (done_.load(std::memory_order_relaxed)) return;
    done_.store(true, std::memory_order_release);
  }
  finished_.notify_all();
}

void Work::fail(std::exception_ptr error) {
  {
    const std::lock_guard lock(mutex_);
    if (done_.load(std::memory_order_relaxed)) return;
    error_ = std::move(error);
    done_.store(true, std::memory_order_release);
  }
  finished_.notify_all();
}

void keep_until_exit(std::shared_ptr<void> buffer) {
  static std::mutex mutex;
  static std::vector<std::shared_ptr<void>> kept;
  const std::lock_guard lock(mutex);
  kept.push_back(std::move(buffer));
}

void wait_all(std::span<const WorkPtr> works, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const auto& work : works) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    work->wait(std::max(left, std::chrono::milliseconds(0)));
  }
}

}  // namespace cohort::comm
