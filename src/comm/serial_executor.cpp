#include "comm/serial_executor.hpp"

#include <fmt/format.h>

#include "cohort/core/error.hpp"
#include "cohort/core/timeline.hpp"

namespace cohort::comm {

SerialExecutor::SerialExecutor(std::string thread_name)
    : worker_([this, name = std::move(thread_name)]() mutable {
        timeline::name_this_thread(std::move(name));
        run();
      }) {}

SerialExecutor::~SerialExecutor() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  worker_.join();
}

WorkPtr SerialExecutor::submit(std::string what, std::function<void()> job) {
  auto work = std::make_shared<Work>(what);
  {
    std::lock_guard lock(mutex_);
    queue_.push_back({std::move(job), work, std::move(what)});
  }
  changed_.notify_all();
  return work;
}

WorkPtr SerialExecutor::submit(std::string what, std::function<void()> job, DeviceEventPtr ready,
                               std::chrono::milliseconds timeout) {
  if (ready == nullptr) return submit(std::move(what), std::move(job));
  auto after_ready = [job = std::move(job), ready = std::move(ready), timeout, what] {
    wait_until_finished(ready, timeout, what);
    job();
  };
  return submit(std::move(what), std::move(after_ready));
}

void SerialExecutor::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;
    Job job = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    if (!first_failure_.empty()) {
      job.work->fail(std::make_exception_ptr(
          IoError(fmt::format("{} was not started: an earlier one on this communicator failed ({})", job.what, first_failure_))));
      lock.lock();
      continue;
    }
    try {
      {
        // Ends before the Work completes, so that a caller who stops the timeline once it returns finds it.
        const timeline::Span span("communication", job.what);
        job.body();
      }
      job.work->complete();
    } catch (const std::exception& e) {
      first_failure_ = e.what();
      job.work->fail(std::current_exception());
    } catch (...) {
      first_failure_ = "an unknown error";
      job.work->fail(std::current_exception());
    }
    lock.lock();
  }
}

}  // namespace cohort::comm
