#pragma once
// IoDriver: runs the TCP transport's io_context on the thread that waits for it. A caller waiting on an
// operation drives the context itself (Work's Poller): its socket calls and completion handlers run on the
// caller's thread, so a message costs no hand-off to another thread and back. Otherwise the driver's own
// thread runs it, so that arrivals, heartbeats and failures are handled while nobody waits.
//
// Handlers never run on two threads at once: before a caller drives, the own thread leaves the context
// (io_context::stop) and parks; it takes the context back once no caller has waited for kLinger (noticed
// within kLookWhileCallersWait), or at once when a caller gives up waiting to sleep (it then needs someone
// to drive) or resume() asks for it.
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "cohort/comm/work.hpp"

namespace cohort::comm::tcp {

class IoDriver {
 public:
  // `own_core`: every rank on this host has a core of its own, so a wait for a large message polls for
  // kSpin before it blocks, as one for a small message does.
  IoDriver(asio::io_context& io, bool own_core);
  ~IoDriver();  // stops the context and joins the own thread
  IoDriver(const IoDriver&) = delete;
  IoDriver& operator=(const IoDriver&) = delete;

  // The poller of a wait for an operation of `bytes`.
  Poller& poller_for(std::size_t bytes) { return bytes < kSpinBelow || own_core_ ? static_cast<Poller&>(spinning_) : blocking_; }
  // The own thread drives again now, unless a caller waits: for a thread that waits on work posted to the
  // context other than through a Work.
  void resume();

 private:
  using Clock = std::chrono::steady_clock;
  // How long the own thread leaves the context to callers after the last one stopped waiting: a collective's
  // next wait comes sooner, and what arrives meanwhile for nobody waits at most this long plus
  // kLookWhileCallersWait.
  static constexpr std::chrono::microseconds kLinger{1000};
  // While callers wait, the parked thread looks this seldom whether they stopped, rather than every kLinger:
  // each look takes the lock every wait takes (2 ranks of 2 cores over TCP, 512 KiB-1 MiB: 1.6-2x the
  // bandwidth of looking every kLinger). A caller that stops without needing it does not wake it.
  static constexpr std::chrono::milliseconds kLookWhileCallersWait{20};
  // A wait for a small message first polls the sockets without blocking for kSpin: on one host its reply
  // comes sooner than the kernel wakes a sleeper (4 KiB on 2 ranks: 7 us spinning, 33 us blocked). So does
  // a wait for a larger one where every rank has a core (512 KiB-2 MiB on 2 ranks of 2 cores: 1.3-1.5x
  // faster than blocking at once). Where ranks outnumber cores, those block in the socket wait at once,
  // leaving the core to the peers (2-16 MiB on 4 ranks of 2 cores: 1.5-2x faster than spinning first).
  static constexpr std::size_t kSpinBelow = 256 * 1024;
  static constexpr std::chrono::microseconds kSpin{50};
  // One socket wait at most; then done() is checked. A waiter whose socket wait returned goes on without
  // yielding its core (4 ranks of 2 cores, 512 KiB-4 MiB: 1.1-1.3x over yielding after every poll).
  static constexpr std::chrono::microseconds kBlock{1000};

  class Waiter final : public Poller {
   public:
    Waiter(IoDriver& driver, bool spins) : driver_(driver), spins_(spins) {}
    void begin() override { driver_.begin(); }
    bool poll() override { return driver_.poll(spins_); }
    void between_polls() override { driver_.between_polls(); }
    void end(bool done) override { driver_.end(done); }
    // A caller blocked in the socket wait costs no core, and the kernel wakes it when bytes come.
    std::chrono::microseconds polling_time() const override { return std::chrono::milliseconds(100); }

   private:
    IoDriver& driver_;
    bool spins_;
  };

  void begin();
  bool poll(bool spin);
  void between_polls();
  void end(bool done);
  void drive();  // the own thread

  asio::io_context& io_;
  bool own_core_;
  asio::executor_work_guard<asio::io_context::executor_type> keep_running_;
  Waiter spinning_{*this, true};
  Waiter blocking_{*this, false};
  std::mutex mutex_;
  std::condition_variable changed_;
  int waiting_ = 0;  // callers between begin() and end()
  bool thread_driving_ = false;
  bool resume_now_ = false;
  bool exiting_ = false;
  Clock::time_point last_wait_ended_{};
  std::mutex polling_;  // held by the caller that drives; others sleep until their operation completes
  std::thread thread_;
};

}  // namespace cohort::comm::tcp
