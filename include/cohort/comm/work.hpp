#pragma once
// Work: the completion handle of an asynchronous operation. wait() blocks until the operation is done
// or its deadline passes; a failure stored by the transport (a lost peer, corrupt bytes) is rethrown
// there, on the caller's thread.
//
//   auto work = transport.send(peer, tag, bytes);
//   work->wait(std::chrono::seconds(30));   // IoError, ProtocolError or TimeoutError on failure

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace cohort::comm {

class Work {
 public:
  // `what` names the operation in a timeout message ("recv from worker 1, tag 7").
  explicit Work(std::string what) : what_(std::move(what)) {}
  // For a transport whose waiting thread can move the bytes itself (shared memory): wait() calls `poll`,
  // yielding between calls, for a short while before it sleeps. `poll` must tolerate concurrent calls.
  Work(std::string what, std::function<void()> poll) : what_(std::move(what)), poll_(std::move(poll)) {}

  // Returns when done; rethrows the failure; throws TimeoutError after `timeout`.
  void wait(std::chrono::milliseconds timeout);
  // As wait(), but false instead of TimeoutError: for a waiter that checks other conditions between waits.
  bool wait_for(std::chrono::milliseconds timeout);
  bool done() const;

  // Called by transports, once; later calls are ignored. Give every Work its own exception object:
  // waiters on different threads rethrow and destroy them independently.
  void complete();
  void fail(std::exception_ptr error);

 private:
  std::string what_;
  std::function<void()> poll_;
  mutable std::mutex mutex_;
  std::condition_variable finished_;
  bool done_ = false;
  std::exception_ptr error_;
};

using WorkPtr = std::shared_ptr<Work>;

// A receive given up on (its peer is stuck) stays posted: the transport may still fill its buffer, which
// must outlive the transport. This keeps the buffer until the process ends; it happens once per failed run.
void keep_until_exit(std::shared_ptr<void> buffer);

// Waits for every handle, in order, each within the remaining time of one shared deadline.
void wait_all(const std::vector<WorkPtr>& works, std::chrono::milliseconds timeout);

}  // namespace cohort::comm
