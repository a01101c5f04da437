#pragma once
// Work: the completion handle of an asynchronous operation. wait() blocks until the operation is done
// or its deadline passes; a failure stored by the transport (a lost peer, corrupt bytes) is rethrown
// there, on the caller's thread.
//
//   auto work = transport.send(peer, tag, bytes);
//   work->wait(std::chrono::seconds(30));   // IoError, ProtocolError or TimeoutError on failure

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <variant>
#include <vector>

namespace cohort::comm {

// A transport whose waiting threads can move the bytes themselves (shared memory, TCP): a wait calls begin(),
// then poll() (yielding between calls) for up to polling_time(), then end(): with `done` true when the
// operation completed meanwhile, false when the waiter goes on to sleep, and then slept() once it wakes
// (the operation done or failed, or the wait timed out). Calls from several waiting threads may overlap.
class Poller {
 public:
  virtual ~Poller() = default;
  virtual void begin() {}
  // False when this waiter should stop polling and sleep (another thread moves the bytes for it).
  virtual bool poll() = 0;
  // Between polls that left the operation unfinished: by default the core goes to whoever else may run.
  // A poller whose poll slept until something happened has nothing to give back and may go on at once.
  virtual void between_polls() { std::this_thread::yield(); }
  virtual void end(bool /*done*/) {}
  virtual void slept() {}
  // By default long enough for a collective's next step to arrive on one host, short enough that a rank
  // waiting for a slow peer soon sleeps and leaves the core to others.
  virtual std::chrono::microseconds polling_time() const { return std::chrono::microseconds(200); }
};

// The names a group's messages give its ranks ("worker 1 (127.0.0.1:4001)"), shared by its transport with
// the Works that may need one: a Work names its peer even when it outlives the transport.
using RankNames = std::shared_ptr<const std::vector<std::string>>;
// "rank N" for a rank the names leave out.
std::string name_of(const RankNames& names, int rank);

// A message to or from a peer, as a timeout message names it ("recv from worker 1, tag 7"). Put into words
// only then: formatting every message's text ahead of time costs a 4 KiB exchange a tenth of its time.
struct PeerOperation {
  const char* verb;  // "send to", "recv from"
  RankNames names;
  int peer;
  std::uint64_t tag;

  std::string text() const;
};

class Work {
 public:
  // `what` names the operation in a timeout message.
  explicit Work(std::string what) : what_(std::move(what)) {}
  explicit Work(PeerOperation what) : what_(std::move(what)) {}
  // Waited with `poller`'s help, which must outlive the wait.
  Work(PeerOperation what, Poller& poller) : what_(std::move(what)), poller_(&poller) {}

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
  std::string what() const;

  std::variant<std::string, PeerOperation> what_;
  Poller* poller_ = nullptr;
  mutable std::mutex mutex_;
  std::condition_variable finished_;
  std::atomic<bool> done_{false};  // set under mutex_; read without it while polling
  std::exception_ptr error_;
};

using WorkPtr = std::shared_ptr<Work>;

// A receive given up on (its peer is stuck) stays posted: the transport may still fill its buffer, which
// must outlive the transport. This keeps the buffer until the process ends; it happens once per failed run.
void keep_until_exit(std::shared_ptr<void> buffer);

// Waits for every handle, in order, each within the remaining time of one shared deadline.
void wait_all(std::span<const WorkPtr> works, std::chrono::milliseconds timeout);
// A send and a receive, as a collective's step waits for them, without building a vector for them.
inline void wait_all(std::initializer_list<WorkPtr> works, std::chrono::milliseconds timeout) {
  wait_all(std::span(works.begin(), works.size()), timeout);
}

}  // namespace cohort::comm
