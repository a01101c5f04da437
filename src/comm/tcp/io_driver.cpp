#include "io_driver.hpp"

namespace cohort::comm::tcp {
namespace {
thread_local std::chrono::steady_clock::time_point wait_began;
thread_local bool last_poll_blocked = false;
}  // namespace

IoDriver::IoDriver(asio::io_context& io, bool own_core) : io_(io), own_core_(own_core), keep_running_(io.get_executor()), thread_([this] { drive(); }) {}

IoDriver::~IoDriver() {
  {
    const std::lock_guard lock(mutex_);
    exiting_ = true;
    io_.stop();
  }
  changed_.notify_all();
  thread_.join();
}

void IoDriver::drive() {
  std::unique_lock lock(mutex_);
  while (!exiting_) {
    const auto now = Clock::now();
    if (waiting_ > 0 || (!resume_now_ && now < last_wait_ended_ + kLinger)) {
      // Timed, so that a caller that stops waiting need not wake this thread (a system call per wait).
      changed_.wait_until(lock, waiting_ > 0 ? now + kLookWhileCallersWait : last_wait_ended_ + kLinger);
      continue;
    }
    resume_now_ = false;
    thread_driving_ = true;
    lock.unlock();
    io_.run();
    lock.lock();
    // Restarted here, under the lock, before a caller may drive: callers never restart a context another
    // caller may be driving, and a stop() that comes later ends the next run at once.
    io_.restart();
    thread_driving_ = false;
    changed_.notify_all();
  }
}

void IoDriver::begin() {
  wait_began = Clock::now();
  std::unique_lock lock(mutex_);
  ++waiting_;
  if (!thread_driving_) return;
  io_.stop();
  changed_.wait(lock, [this] { return !thread_driving_; });
}

bool IoDriver::poll(bool spin) {
  const std::unique_lock driving(polling_, std::try_to_lock);
  if (!driving) return false;
  last_poll_blocked = !(spin && Clock::now() - wait_began < kSpin);
  if (last_poll_blocked) io_.run_one_for(kBlock);
  else io_.poll();
  return true;
}

void IoDriver::between_polls() {
  // A poll that blocked returned because a handler ran (or kBlock passed): this thread has work to go on
  // with, and yielding would hand its core to a peer in the middle of a message.
  if (!last_poll_blocked) std::this_thread::yield();
}

void IoDriver::end(bool done) {
  {
    const std::lock_guard lock(mutex_);
    --waiting_;
    last_wait_ended_ = Clock::now();
    if (!done) resume_now_ = true;
    // The own thread waits out kLinger unless a waiter sleeps: then it drives as soon as nobody else does.
    if (!resume_now_ || waiting_ > 0) return;
  }
  changed_.notify_all();
}

void IoDriver::resume() {
  {
    const std::lock_guard lock(mutex_);
    resume_now_ = true;
  }
  changed_.notify_all();
}

}  // namespace cohort::comm::tcp
