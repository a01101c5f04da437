#pragma once
// Server: one parameter server. It owns the shards the plan gives it and their optimizer state, and applies
// the optimizer itself. Every worker is served by its own thread: per step a worker sends one request with
// all its gradients for this server and gets the fresh values back in the same round trip; how gradients
// become updates follows the consistency mode (consistency.hpp).
//
// Requests are checked before anything changes: header magic and version, the plan fingerprint, the kind,
// the payload size the plan implies, the payload's CRC-32C and finite gradients. A bad request is refused
// with a reason sent back to the worker, counted, logged, and that worker is no longer served; the
// variables stay as they were. A lost worker (IoError from the transport) ends serve() with that error.
//
// Progress is bounded, not only liveness: a worker whose next request, or whose gradients for a Sync step,
// do not come within the progress deadline (ServerOptions::wait_timeout, growing with the longest such wait
// the run has shown) is named stuck ("worker 1 (...) is stuck: ..."). Whatever ends serving, every worker
// still served gets the reason as a Failed answer, and serve() returns without waiting for a stuck worker.
//
// A Sync step sums the workers' gradients in worker order whatever order they arrive in, in double
// precision (each float product with the sample count is exact there), so a step's result is the same bits
// on every run and every instruction set.
//
// Loss-scaled workers (mixed_float16) flag a Push whose gradients overflowed instead of sending it as a
// refusable request: under Sync a step with any flagged Push changes nothing (no variable, no optimizer slot
// or iteration) yet counts as a step, and every answer of it says it was skipped; under Async and
// BoundedStaleness the flagged Push alone is dropped. Sync with backup workers refuses the flag: each
// server may count other workers' gradients, so they could disagree on a skip.
//
//   ps::Server server(transport, plan, /*server=*/0, /*worker_ranks=*/{0, 1}, optimizer, ps::Sync{});
//   server.serve();   // returns when every worker has said Done

#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <span>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cohort/comm/transport.hpp"
#include "cohort/comm/progress_deadline.hpp"
#include "cohort/optim/optimizer.hpp"
#include "cohort/ps/consistency.hpp"
#include "cohort/ps/placement.hpp"
#include "cohort/ps/snapshot.hpp"
#include "cohort/ps/stats.hpp"

namespace cohort::ps {

namespace protocol {
struct RequestHeader;
struct MemoryRange;
}

struct ServerOptions {
  Consistency consistency = Sync{};
  // Where Save requests write snapshots (the same directory the chief writes the manifest to).
  std::filesystem::path checkpoint_dir;
  // The progress deadline's floor (comm ProgressDeadline): how long the server waits for a worker's next
  // request, a Sync step's missing gradients or a BoundedStaleness laggard before naming it stuck.
  // 0: the transport's operation deadline (COHORT_TIMEOUT). Lost processes are reported much sooner by
  // the transport; this bounds a live but stuck one.
  std::chrono::milliseconds wait_timeout{0};
  // OpenMP threads of each serving thread's optimizer update; 0: the process's (OMP_NUM_THREADS, else every
  // core). One by default: a server moves bytes more than it computes, and a team's idle threads spin on
  // the cores its sockets need (the flagship's push+pull in cohort_ps_bench: 1.30-1.50 GB/s with one
  // thread against 1.23-1.41 with two).
  int update_threads = 1;
};

class Server {
 public:
  // `optimizer` and `transport` must outlive the server.
  Server(comm::Transport& transport, Plan plan, int server, std::vector<int> worker_ranks, optim::Optimizer& optimizer,
         ServerOptions options = {});

  // Takes this server's shards from a checkpoint written by any topology; then no Init is awaited.
  void restore(const std::vector<ServerSnapshot>& snapshots);
  // Serves until every worker has said Done (or was refused); rethrows the first transport failure.
  void serve();

  ServerStats stats() const;
  // The current value of one of this server's shards (by Shard::name()), for tests and tools.
  std::vector<float> value_of(const std::string& shard_name) const;

 private:
  struct Held {
    const Shard* shard;
    Tensor value, gradient;  // gradient: scratch for the optimizer, trainable shards only
    std::size_t offset;      // in floats, within a payload
  };
  struct Inbox;
  // The first worker (in worker order) whose Push of a skipped step was flagged kNotFinite, and the plan's
  // index of its first overflowed shard.
  struct Skip {
    int worker = -1;
    std::int32_t shard = -1;
  };

  void serve_worker(int worker, Inbox& inbox);
  // Waits for the next request of `worker`; false once serving has failed; TimeoutError naming it stuck.
  bool await_request(int worker, const comm::WorkPtr& received, const std::string& after);
  // An empty string when the header is acceptable, else why not.
  std::string check_header(const protocol::RequestHeader& header, int worker) const;
  std::string check_finite(const std::vector<float>& payload) const;
  // Reads a Push in place: each shard's bytes from where `ranges` says in the worker's memory into `into`, at
  // the shard's offset. An empty string when done, else why not (a range of the wrong size or unreadable).
  std::string read_in_place(int worker, std::span<const protocol::MemoryRange> ranges, std::span<std::byte> into,
                            std::size_t element_bytes);
  // Why a well-formed request cannot be served in the server's current state; empty when it can.
  std::string refusal_locked(const protocol::RequestHeader& header) const;
  // Answers one request; true when this worker is finished.
  bool handle(int worker, const protocol::RequestHeader& header, const std::vector<float>& payload);
  // `overflow_shard`: >= 0 when the Push is flagged kNotFinite; `skipped` says whether it was applied.
  bool push_sync_locked(std::unique_lock<std::mutex>& lock, int worker, const protocol::RequestHeader& header,
                        const std::vector<float>& payload, std::int64_t& staleness, std::optional<Skip>& skipped);
  bool push_async_locked(std::unique_lock<std::mutex>& lock, int worker, const protocol::RequestHeader& header,
                         const std::vector<float>& payload, std::int64_t& staleness, std::optional<Skip>& skipped);
  void complete_sync_step_if_ready_locked();
  // The current Sync step is over (applied or skipped): its contributions are let go, its waiters woken.
  void end_sync_step_locked();
  // Applies the current Sync step: its contributions summed in worker order.
  void apply_sync_step_locked();
  // Applies `source` alone (an asynchronous push): its gradients unless `with_gradients` is false, its value changes.
  void apply_locked(const float* source, bool with_gradients);
  // One shard's part of an update: term(i), element i's sum in double, times `scale` as the gradient into the
  // optimizer (trainable) or as a change added to the value.
  template <typename Term>
  void update_locked(Held& held, double scale, Term term);
  void finish_update_locked();
  void finish_worker_locked(int worker);
  int active_workers_locked() const;
  std::int64_t slowest_clock_locked() const;
  std::string missing_workers_locked(std::int64_t step) const;
  // The workers whose clock is below `clock`, named stuck.
  std::string laggards_locked(std::int64_t clock) const;
  // Waits until ready(); false when serving failed meanwhile; past the progress deadline TimeoutError
  // with culprit()'s text ("worker 1 (...) is stuck: ...").
  template <typename Ready, typename Culprit>
  bool wait_locked(std::unique_lock<std::mutex>& lock, Ready ready, Culprit culprit);
  // The workers that a Sync step, or the wait for their next request, has waited for longer than half the
  // progress deadline, named stuck (not one that `reason`, why serving ended, names); empty when none.
  // Serving failed for another reason meanwhile (a worker left), perhaps because of them.
  std::string overdue_workers(const std::string& reason) const;
  // Tells every worker not yet finished why serving ended (a Failed answer).
  void announce_failure(const std::string& reason);
  // The values as every answer carries them, copied once per change and shared by the answers in flight;
  // checksummed (in the copy) once an answer sends them as a message.
  struct Published {
    std::vector<float> values;
    std::optional<std::uint32_t> crc;
  };
  std::shared_ptr<const Published> published_values_locked(bool checksummed);
  // The held values are about to change: the next answer publishes them anew.
  void values_changed_locked();
  // The first retired copy that no answer holds any more (each lets go under the lock), or retired_.end().
  std::vector<std::shared_ptr<Published>>::iterator free_retired_locked();
  ServerSnapshot snapshot_locked() const;
  ServerStats stats_locked() const;
  void refuse(int worker, const std::string& reason);
  // `payload`: its pieces, a message each; `crc`: the payload's CRC-32C. `values_in_place`: the payload is
  // the MemoryRanges of that many bytes of values.
  void reply(int worker, std::int64_t staleness, std::span<const std::span<const std::byte>> payload, std::uint32_t crc,
             const std::optional<Skip>& skipped, std::optional<std::size_t> values_in_place = {});
  void reply(int worker, std::int64_t staleness, std::span<const std::byte> payload, std::uint32_t crc);
  // The CRC-32C of the held values in plan order, once per change.
  std::uint32_t held_values_crc_locked();
  // Answers a Pull or Push with the current values (`lock` held on entry, released before sending). In place:
  // the answer names one MemoryRange per shard, of the held values or of a copy lent to the worker until
  // its next request.
  void answer_values(std::unique_lock<std::mutex>& lock, int worker, std::int64_t staleness,
                     const std::optional<Skip>& skipped, bool in_place);
  void record_latency(double milliseconds);

  comm::Transport& transport_;
  Plan plan_;
  int server_;
  std::vector<int> worker_ranks_;
  optim::Optimizer& optimizer_;
  ServerOptions options_;
  comm::ProgressDeadline deadline_;
  std::vector<Held> held_;
  std::size_t payload_floats_ = 0;
  comm::PeerMemory* worker_memory_ = nullptr;  // where this server reads its workers' memory (Pushes in place)

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::exception_ptr first_error_;
  bool initialized_ = false;
  bool run_ended_ = false;
  bool failed_ = false;
  std::int64_t version_ = 0;  // updates applied
  std::shared_ptr<Published> published_;  // the current values' answer, once asked for
  std::vector<std::shared_ptr<Published>> retired_;  // older ones, reused once no answer holds them
  std::optional<std::uint32_t> held_values_crc_;  // of the held values, once asked for since their last change
  std::vector<std::shared_ptr<const Published>> lent_;  // per worker: named by its last answer in place, until its next request
  // Sync: the current step's gradients so far, each in its worker's request buffer (that worker's thread
  // waits for the step), summed in worker order when the step is complete: all but the last contribution
  // in here, the last on its way to the optimizer.
  std::vector<double> accumulator_;
  int contributors_ = 0;
  std::int64_t contributed_samples_ = 0;
  std::vector<const float*> contributions_;  // per worker: its gradients of the current step, or null
  std::vector<std::int64_t> contribution_samples_;
  std::vector<std::int32_t> overflow_shards_;  // per worker: its current step's overflowed shard, or -1
  std::optional<std::pair<std::int64_t, Skip>> last_skipped_;  // Sync: the last skipped step, and why
  std::chrono::steady_clock::time_point step_started_{};  // the current step's first contribution
  std::vector<std::optional<std::chrono::steady_clock::time_point>> idle_since_;  // per worker: awaiting its request since
  std::vector<std::int64_t> clocks_;  // per worker: pushes applied (BoundedStaleness)
  std::vector<char> finished_;        // per worker: Done or refused
  ServerStats stats_;
  std::vector<double> latencies_ms_;  // the most recent ones, a ring, for the p99
  std::size_t latency_next_ = 0;
  std::int64_t latency_count_ = 0;
  double latency_sum_ms_ = 0;
};

}  // namespace cohort::ps
