#pragma once
// SerialExecutor: runs submitted jobs one after another on a thread of its own and reports each through
// a Work, so that a communicator's collectives return at once yet keep their call order. Once a job has
// failed, later ones fail without running: a collective given up midway leaves the peers midway through
// theirs, and the next one's messages, on the same tags, would be taken for the rest of it.
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "cohort/comm/work.hpp"
#include "cohort/core/device_event.hpp"

namespace cohort::comm {

class SerialExecutor {
 public:
  // `thread_name` names its thread's track on the timeline.
  explicit SerialExecutor(std::string thread_name);
  // Runs what is queued, then stops.
  ~SerialExecutor();
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  // `what` names the job in a timeout ("allreduce of 4096 bytes over ring") and on the timeline, where
  // its run is an event of category "communication"; a job that throws fails its Work with that exception.
  WorkPtr submit(std::string what, std::function<void()> job);
  // As submit(), but the job begins once `ready` is passed (the device has written the buffer it reads),
  // awaited on the executor's thread within `timeout`.
  WorkPtr submit(std::string what, std::function<void()> job, DeviceEventPtr ready, std::chrono::milliseconds timeout);

 private:
  void run();

  struct Job {
    std::function<void()> body;
    WorkPtr work;
    std::string what;
  };
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Job> queue_;
  bool stopping_ = false;
  std::string first_failure_;  // what the first failed job threw; the worker thread's alone
  std::thread worker_;
};

}  // namespace cohort::comm
