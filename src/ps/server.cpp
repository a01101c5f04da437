#include "cohort/ps/server.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <thread>

#include "cohort/core/check.hpp"
#include "cohort/core/logging.hpp"
#include "cohort/core/parallel.hpp"
#include "cohort/core/timeline.hpp"
#include "core/crc32c.hpp"
#include "ps/protocol.hpp"
#include "ps/stats_codec.hpp"

namespace cohort::ps {
namespace {

using Clock = std::chrono::steady_clock;
namespace proto = protocol;

// How often a thread waiting for a worker's next request looks whether serving has failed meanwhile.
constexpr auto kFailureCheck = std::chrono::milliseconds(100);
constexpr std::size_t kLatencyWindow = 4096;

template <typename T>
std::span<const std::byte> bytes_of(const T& value) {
  return std::as_bytes(std::span(&value, 1));
}

// The index of the first element of `values` that is infinite or NaN, or `count` when all are finite. Blocks
// are scanned without an early exit, which vectorizes; only a block that holds one is searched.
std::int64_t first_not_finite(const float* values, std::int64_t count) {
  constexpr std::int64_t kBlock = 1024;
  constexpr std::uint32_t kExponent = 0x7f800000;  // all ones: infinite or NaN
  for (std::int64_t begin = 0; begin < count; begin += kBlock) {
    const std::int64_t end = std::min(count, begin + kBlock);
    std::uint32_t any = 0;
    for (std::int64_t i = begin; i < end; ++i) any |= (std::bit_cast<std::uint32_t>(values[i]) & kExponent) == kExponent;
    if (any == 0) continue;
    for (std::int64_t i = begin; i < end; ++i)
      if (!std::isfinite(values[i])) return i;
  }
  return count;
}

std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an unknown error";
  }
}

}  // namespace

// A worker's request as it arrives: its header, then its payload.
struct Server::Inbox {
  proto::RequestHeader header;
  std::vector<float> payload;
  std::vector<std::uint16_t> bfloat16_payload;  // a bfloat16 push as it arrived
  std::vector<proto::MemoryRange> ranges;       // a push in place: where its shards lie in the worker's memory
};

Server::Server(comm::Transport& transport, Plan plan, int server, std::vector<int> worker_ranks,
               optim::Optimizer& optimizer, ServerOptions options)
    : transport_(transport),
      plan_(std::move(plan)),
      server_(server),
      worker_ranks_(std::move(worker_ranks)),
      optimizer_(optimizer),
      options_(std::move(options)),
      deadline_(options_.wait_timeout.count() > 0 ? options_.wait_timeout : transport_.timeout()) {
  COHORT_CHECK(server_ >= 0 && server_ < plan_.servers(), "server index {} is outside the plan's {} servers", server_,
               plan_.servers());
  COHORT_CHECK(!worker_ranks_.empty(), "a parameter server needs at least one worker");
  COHORT_CHECK(options_.update_threads >= 0, "a parameter server's update_threads must be >= 0 (0: the process's count), got {}",
               options_.update_threads);
  if (const auto* sync = std::get_if<Sync>(&options_.consistency))
    COHORT_CHECK(sync->backup_workers >= 0 && sync->backup_workers < static_cast<int>(worker_ranks_.size()),
                 "{} backup workers among {} workers: at least one gradient must count", sync->backup_workers,
                 worker_ranks_.size());
  if (const auto* bounded = std::get_if<BoundedStaleness>(&options_.consistency))
    COHORT_CHECK(bounded->max_staleness >= 0, "bounded staleness must be >= 0, got {}", bounded->max_staleness);
  for (const Shard& shard : plan_.shards()) {
    if (shard.server != server_) continue;
    held_.push_back({&shard, Tensor(shard.shape), shard.trainable ? Tensor(shard.shape) : Tensor(), payload_floats_});
    payload_floats_ += static_cast<std::size_t>(shard.shape.numel());
  }
  accumulator_.assign(payload_floats_, 0.0);
  transport_.expect_messages_up_to(payload_floats_ * sizeof(float));  // what the plan lets a request carry
  const std::size_t workers = worker_ranks_.size();
  contributions_.assign(workers, nullptr);
  lent_.resize(workers);
  idle_since_.assign(workers, std::nullopt);
  contribution_samples_.assign(workers, 0);
  overflow_shards_.assign(workers, -1);
  clocks_.assign(workers, 0);
  finished_.assign(workers, 0);
  stats_.server = server_;
  stats_.workers.resize(workers);
}

void Server::restore(const std::vector<ServerSnapshot>& snapshots) {
  const std::lock_guard lock(mutex_);
  values_changed_locked();
  for (Held& held : held_) {
    std::vector<Tensor> slots;
    copy_rows(snapshots, held.shard->variable, held.shard->row_begin, held.shard->row_end, held.value,
              held.shard->trainable ? &slots : nullptr);
    if (!held.shard->trainable) continue;
    COHORT_CHECK_AS(DataError, static_cast<int>(slots.size()) == optimizer_.slots_per_variable(),
                    "checkpoint: '{}' has {} optimizer slots saved, {} keeps {}", held.shard->name(), slots.size(),
                    optimizer_.name(), optimizer_.slots_per_variable());
    if (!slots.empty()) optimizer_.set_slots(held.shard->name(), {std::move(slots)});
  }
  std::int64_t iterations = 0, step = 0;
  for (const auto& snapshot : snapshots) {
    COHORT_CHECK_AS(DataError, snapshot.optimizer == optimizer_.name(),
                    "checkpoint: server {} saved {} state, this run uses {}", snapshot.server, snapshot.optimizer,
                    optimizer_.name());
    iterations = std::max(iterations, snapshot.iterations);
    step = std::max(step, snapshot.step);
  }
  optimizer_.set_iterations(iterations);
  version_ = step;
  initialized_ = true;
}

void Server::serve() {
  try {
    // Asked once, before any request: every worker learns it from the first answer.
    if (comm::PeerMemory* memory = transport_.peer_memory(); memory != nullptr && memory->can_reach_every_peer())
      worker_memory_ = memory;
  } catch (const Error& e) {
    log::error("ps {}: {}", server_, e.what());
    announce_failure(e.what());
    throw;
  }
  std::vector<std::thread> threads;
  std::vector<std::shared_ptr<Inbox>> inboxes;
  for (int w = 0; w < static_cast<int>(worker_ranks_.size()); ++w) {
    inboxes.push_back(std::make_shared<Inbox>());
    threads.emplace_back([this, w, inbox = inboxes.back()] {
      try {
        set_num_threads(options_.update_threads);  // this thread's parallel regions only
        serve_worker(w, *inbox);
      } catch (...) {
        const std::lock_guard lock(mutex_);
        if (!first_error_) first_error_ = std::current_exception();
        failed_ = true;
        changed_.notify_all();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  if (!first_error_) return;
  for (auto& inbox : inboxes) comm::keep_until_exit(std::move(inbox));  // a stuck worker's receive stays posted
  // A worker may still be reading its last answer: the copy lent to it, or the held values.
  for (auto& lent : lent_)
    if (lent) comm::keep_until_exit(std::const_pointer_cast<Published>(std::move(lent)));
  auto held_values = std::make_shared<std::vector<Tensor>>();
  for (const Held& held : held_) held_values->push_back(held.value);
  comm::keep_until_exit(std::move(held_values));
  std::string reason = message_of(first_error_);
  // Another process may have named a stuck worker first and left: this server then sees it leave, but the
  // step it has long waited for points at the cause.
  const std::string overdue = reason.find(" is stuck") == std::string::npos ? overdue_workers(reason) : std::string();
  if (!overdue.empty()) reason += "; meanwhile " + overdue;
  log::error("ps {}: {}", server_, reason);
  announce_failure(reason);
  if (overdue.empty()) std::rethrow_exception(first_error_);
  throw IoError(reason);
}

void Server::serve_worker(int worker, Inbox& inbox) {
  const int rank = worker_ranks_[static_cast<std::size_t>(worker)];
  std::string after = "the start";
  for (;;) {
    auto received = transport_.recv(rank, proto::kRequestTag, std::as_writable_bytes(std::span(&inbox.header, 1)));
    if (!await_request(worker, received, after)) return;
    {
      const std::lock_guard lock(mutex_);
      lent_[static_cast<std::size_t>(worker)].reset();  // a worker asks again only once it has read its last answer
    }
    const proto::RequestHeader& header = inbox.header;
    const auto start = Clock::now();
    if (const std::string problem = check_header(header, worker); !problem.empty()) {
      refuse(worker, problem);
      return;
    }
    std::vector<float>& payload = inbox.payload;
    const bool bfloat16 = header.payload_dtype == static_cast<std::uint32_t>(DType::BFloat16);
    const bool in_place = (header.flags & proto::kPayloadInPlace) != 0;
    const std::size_t element_bytes = bfloat16 ? sizeof(std::uint16_t) : sizeof(float);
    const std::size_t floats = in_place ? payload_floats_ : header.payload_bytes / element_bytes;
    std::span<std::byte> arriving;
    if (bfloat16) {
      inbox.bfloat16_payload.resize(floats);
      arriving = std::as_writable_bytes(std::span(inbox.bfloat16_payload));
    } else {
      payload.resize(floats);
      arriving = std::as_writable_bytes(std::span(payload));
    }
    // The floats come as one message per shard, straight into place; in place, the ranges as one.
    std::vector<std::span<std::byte>> messages;
    if (in_place) {
      inbox.ranges.resize(held_.size());
      messages.push_back(std::as_writable_bytes(std::span(inbox.ranges)));
    } else if (!arriving.empty()) {
      for (const Held& held : held_)
        messages.push_back(arriving.subspan(held.offset * element_bytes, static_cast<std::size_t>(held.value.numel()) * element_bytes));
    }
    std::erase_if(messages, [](const auto& message) { return message.empty(); });  // nothing empty travels
    std::vector<comm::WorkPtr> receives;
    for (const auto& message : messages) receives.push_back(transport_.recv(rank, proto::kRequestPayloadTag, message));
    // The payload follows its header at once: a worker that stops between the two is stuck, not pausing.
    const auto give_up = Clock::now() + deadline_.limit();
    std::uint32_t crc = 0;
    for (std::size_t m = 0; m < messages.size(); ++m) {
      bool arrived = false;
      try {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(give_up - Clock::now());
        arrived = receives[m]->wait_for(std::max(std::chrono::milliseconds(0), left));
      } catch (const ProtocolError& e) {  // a piece of another size than its shard
        refuse(worker, e.what());
        return;
      }
      if (!arrived)
        throw TimeoutError(comm::stuck_message(
            transport_.describe(rank) + " is stuck",
            fmt::format("ps {} got the header of its {} of step {} but not the {} bytes that follow it", server_,
                        proto::kind_name(header.kind), header.step, header.payload_bytes),
            deadline_.limit()));
      crc = crc32c_extend(crc, messages[m].data(), messages[m].size());  // while the next shards arrive
    }
    {
      const std::lock_guard lock(mutex_);
      ++stats_.requests;
      stats_.bytes_in += static_cast<std::int64_t>(sizeof header + arriving.size());
    }
    if (crc != header.payload_crc) {
      refuse(worker, fmt::format("{} payload of {} bytes fails its checksum (garbled in transit)",
                                 proto::kind_name(header.kind), header.payload_bytes));
      return;
    }
    if (in_place) {
      if (const std::string problem = read_in_place(worker, inbox.ranges, arriving, element_bytes); !problem.empty()) {
        refuse(worker, problem);
        return;
      }
    }
    if (bfloat16) {
      payload.resize(inbox.bfloat16_payload.size());
      for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = from_bfloat16_bits(inbox.bfloat16_payload[i]);
    }
    const bool flagged_not_finite = (header.flags & proto::kNotFinite) != 0;
    if (const std::string problem = flagged_not_finite ? std::string() : check_finite(payload); !problem.empty()) {
      refuse(worker, problem);
      return;
    }
    after = fmt::format("its {} of step {}", proto::kind_name(header.kind), header.step);
    const bool done = handle(worker, header, payload);
    record_latency(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    if (done) return;
  }
}

bool Server::await_request(int worker, const comm::WorkPtr& received, const std::string& after) {
  // Between two requests a worker computes, validates or writes checkpoints: legitimate pauses, which the
  // deadline learns; a worker silent past it is stuck (a lost one is reported by the transport sooner),
  // unless it has made progress with the other servers since or waits on another worker (an agreement,
  // the end of the run), which that worker judges. Under Sync a silent worker may be waiting for another
  // server's answer, whose step waits for the stuck one: that server, which has the evidence, is given
  // the time to name it first.
  const auto since = Clock::now();
  const bool sync = std::holds_alternative<Sync>(options_.consistency);
  const auto w = static_cast<std::size_t>(worker);
  const int rank = worker_ranks_[w];
  comm::ProgressWatch watch(transport_, rank);
  {
    const std::lock_guard lock(mutex_);
    idle_since_[w] = since;
  }
  for (;;) {
    const bool arrived = received->wait_for(kFailureCheck);
    bool run_ended = false;
    {
      const std::lock_guard lock(mutex_);
      if (failed_) return false;  // serve() answers this request with the reason
      if (arrived) idle_since_[w].reset();
      run_ended = run_ended_;
    }
    if (arrived) break;
    // Once the chief has ended the run no step of another server waits on this worker: no one else names it.
    const auto limit = deadline_.limit() + (sync && !run_ended ? deadline_.limit() / 2 : std::chrono::milliseconds(0));
    if (watch.idle() > limit)
      throw TimeoutError(comm::stuck_message(transport_.describe(rank) + " is stuck",
                                             fmt::format("ps {} got no request after {}", server_, after), limit));
  }
  // A wait that outlasted the deadline was one on another process, not a pause to learn from.
  if (const auto waited = Clock::now() - since; waited <= deadline_.limit()) deadline_.observe(waited);
  return true;
}

std::string Server::check_header(const protocol::RequestHeader& header, int worker) const {
  if (header.magic != proto::kRequestMagic)
    return fmt::format("not a parameter-server request (magic {:08x}, expected {:08x})", header.magic, proto::kRequestMagic);
  if (header.version != proto::kVersion)
    return fmt::format("protocol version {}, this server speaks {}", header.version, proto::kVersion);
  if (header.plan_fingerprint != plan_.fingerprint())
    return fmt::format("placement plan {:016x} differs from this server's {:016x} (another model, policy or server count)",
                       header.plan_fingerprint, plan_.fingerprint());
  const auto kind = static_cast<proto::Kind>(header.kind);
  if (header.kind < static_cast<std::uint16_t>(proto::Kind::Init) || header.kind > static_cast<std::uint16_t>(proto::Kind::Done))
    return fmt::format("unknown request kind {}", header.kind);
  const auto dtype = dtype_from_code(static_cast<std::uint8_t>(header.payload_dtype));
  const bool bfloat16_push = kind == proto::Kind::Push && dtype == DType::BFloat16;
  if (header.payload_dtype > 0xff || (dtype != DType::Float32 && !bfloat16_push))
    return fmt::format("{} announces payload element type code {}: a Push carries float32 or bfloat16, the rest float32",
                       proto::kind_name(header.kind), header.payload_dtype);
  if ((header.flags & ~(proto::kNotFinite | proto::kPayloadInPlace | proto::kAnswerInPlace)) != 0)
    return fmt::format("unknown request flags {:#x}", header.flags);
  const bool in_place = (header.flags & proto::kPayloadInPlace) != 0;
  if (in_place && kind != proto::Kind::Push)
    return fmt::format("{} with its payload in place: only a Push may be", proto::kind_name(header.kind));
  if (in_place && worker_memory_ == nullptr) return "a Push in place, but this server does not read its workers' memory";
  if ((header.flags & proto::kAnswerInPlace) != 0 && kind != proto::Kind::Pull && kind != proto::Kind::Push)
    return fmt::format("{} asks for its answer in place: only a Pull or a Push is answered with values", proto::kind_name(header.kind));
  if ((header.flags & proto::kAnswerInPlace) != 0 && transport_.peer_memory() == nullptr)
    return "an answer in place asked for, but not every process is on this server's host";
  const std::uint64_t expected = in_place ? held_.size() * sizeof(proto::MemoryRange)
                                 : kind == proto::Kind::Init || kind == proto::Kind::Push
                                     ? payload_floats_ * (bfloat16_push ? sizeof(std::uint16_t) : sizeof(float))
                                     : 0;
  if (header.payload_bytes != expected)
    return fmt::format("{} announces {} payload bytes, the plan gives this server {}", proto::kind_name(header.kind),
                       header.payload_bytes, expected);
  if (kind == proto::Kind::Init && worker != 0) return "only the chief initializes the variables";
  if (header.samples < 0) return fmt::format("negative sample count {}", header.samples);
  if (header.step < 0) return fmt::format("negative step {}", header.step);
  if (!std::isfinite(header.learning_rate_factor) || header.learning_rate_factor <= 0)
    return fmt::format("learning-rate factor {} is not positive and finite", header.learning_rate_factor);
  if ((header.flags & proto::kNotFinite) != 0) {
    if (kind != proto::Kind::Push) return fmt::format("{} flagged as not finite: only a Push may be", proto::kind_name(header.kind));
    if (header.overflow_shard < 0 || static_cast<std::size_t>(header.overflow_shard) >= plan_.shards().size())
      return fmt::format("a Push flagged as not finite names shard {}, the plan has {}", header.overflow_shard, plan_.shards().size());
    if (const auto* sync = std::get_if<Sync>(&options_.consistency); sync != nullptr && sync->backup_workers > 0)
      return "a Push flagged as not finite under backup workers: the servers could disagree on skipping its step";
  }
  return {};
}

std::string Server::read_in_place(int worker, std::span<const proto::MemoryRange> ranges, std::span<std::byte> into,
                                  std::size_t element_bytes) {
  std::vector<comm::PeerCopy> copies;
  for (std::size_t i = 0; i < held_.size(); ++i) {
    const Held& held = held_[i];
    const std::size_t bytes = static_cast<std::size_t>(held.value.numel()) * element_bytes;
    if (ranges[i].bytes != bytes)
      return fmt::format("Push in place names {} bytes for '{}', which holds {}", ranges[i].bytes, held.shard->name(), bytes);
    copies.push_back({.address = ranges[i].address, .into = into.subspan(held.offset * element_bytes, bytes)});
  }
  try {
    worker_memory_->read(worker_ranks_[static_cast<std::size_t>(worker)], copies);
  } catch (const ProtocolError& e) {
    constexpr std::string_view kPrefix = "protocol error: ";
    const std::string_view what = e.what();
    return fmt::format("Push in place: {}", what.starts_with(kPrefix) ? what.substr(kPrefix.size()) : what);
  }
  return {};
}

std::string Server::check_finite(const std::vector<float>& payload) const {
  for (const Held& held : held_) {
    if (held.offset >= payload.size()) break;
    const float* values = payload.data() + held.offset;
    const std::int64_t bad = first_not_finite(values, held.value.numel());
    if (bad < held.value.numel()) return fmt::format("'{}' holds {} at element {}", held.shard->name(), values[bad], bad);
  }
  return {};
}

std::string Server::refusal_locked(const protocol::RequestHeader& header) const {
  switch (static_cast<proto::Kind>(header.kind)) {
    case proto::Kind::Init:
      return initialized_ ? "Init, but the variables are already initialized" : "";
    case proto::Kind::Push:
      if (!initialized_) return "Push before the variables were initialized";
      if (header.step > version_) return fmt::format("Push for step {}, the server is at step {}", header.step, version_);
      return {};
    case proto::Kind::Save:
      return options_.checkpoint_dir.empty() ? "Save, but this server was given no checkpoint directory" : "";
    default:
      return {};
  }
}

bool Server::handle(int worker, const protocol::RequestHeader& header, const std::vector<float>& payload) {
  std::unique_lock lock(mutex_);
  if (const std::string reason = refusal_locked(header); !reason.empty()) {
    lock.unlock();
    refuse(worker, reason);
    return true;
  }
  switch (static_cast<proto::Kind>(header.kind)) {
    case proto::Kind::Init: {
      values_changed_locked();
      for (Held& held : held_)
        std::copy_n(payload.data() + held.offset, held.value.numel(), held.value.data());
      initialized_ = true;
      changed_.notify_all();
      lock.unlock();
      reply(worker, 0, {}, crc32c_of(nullptr, 0));
      return false;
    }
    case proto::Kind::Pull: {
      if (!wait_locked(lock, [&] { return initialized_; }, [&] {
            return comm::stuck_message(transport_.describe(worker_ranks_[0]) + " is stuck",
                                       fmt::format("ps {} got no initial values", server_), deadline_.limit());
          }))
        return true;
      answer_values(lock, worker, 0, {}, (header.flags & proto::kAnswerInPlace) != 0);
      return false;
    }
    case proto::Kind::Push: {
      // The chief's rate rules: where the processes do not agree (backup workers), a worker's own request must not
      // change the rate of every update until the chief's next push.
      if (worker == 0) optimizer_.set_learning_rate_factor(header.learning_rate_factor);
      std::int64_t staleness = 0;
      std::optional<Skip> skipped;
      const bool answered = std::holds_alternative<Sync>(options_.consistency)
                                ? push_sync_locked(lock, worker, header, payload, staleness, skipped)
                                : push_async_locked(lock, worker, header, payload, staleness, skipped);
      if (!answered) return true;
      answer_values(lock, worker, staleness, skipped, (header.flags & proto::kAnswerInPlace) != 0);
      return false;
    }
    case proto::Kind::Save: {
      ServerSnapshot snapshot = snapshot_locked();
      lock.unlock();
      const SnapshotFile file = write_snapshot(options_.checkpoint_dir, header.step, snapshot);
      const proto::SnapshotReceipt receipt{.bytes = file.bytes, .crc = file.crc};
      reply(worker, 0, bytes_of(receipt), crc32c_of(&receipt, sizeof receipt));
      return false;
    }
    case proto::Kind::Stats: {
      const std::string encoded = encode_stats(stats_locked());
      lock.unlock();
      reply(worker, 0, std::as_bytes(std::span(encoded)), crc32c_of(encoded.data(), encoded.size()));
      return false;
    }
    case proto::Kind::Done: {
      finish_worker_locked(worker);
      if (worker == 0) {
        run_ended_ = true;
        // A rate agreed after the last push (a cut at the end of the last epoch) still reaches the servers.
        optimizer_.set_learning_rate_factor(header.learning_rate_factor);
      }
      lock.unlock();
      reply(worker, 0, {}, crc32c_of(nullptr, 0));
      return true;
    }
  }
  return true;
}

bool Server::push_sync_locked(std::unique_lock<std::mutex>& lock, int worker, const proto::RequestHeader& header,
                              const std::vector<float>& payload, std::int64_t& staleness, std::optional<Skip>& skipped) {
  const std::int64_t step = header.step, samples = header.samples;
  WorkerCounters& counters = stats_.workers[static_cast<std::size_t>(worker)];
  ++counters.pushes;
  if (step < version_) {
    // A backup worker's gradient that came after its step was complete: dropped and counted.
    ++counters.dropped;
    staleness = version_ - step;
    return true;
  }
  const auto w = static_cast<std::size_t>(worker);
  if (contributors_ == 0) step_started_ = Clock::now();
  contributions_[w] = payload.data();
  contribution_samples_[w] = samples;
  overflow_shards_[w] = (header.flags & proto::kNotFinite) != 0 ? header.overflow_shard : -1;
  ++contributors_;
  contributed_samples_ += samples;
  complete_sync_step_if_ready_locked();
  if (!wait_locked(lock, [&] { return version_ > step; }, [&] { return missing_workers_locked(step); })) return false;
  // No later step can complete before this worker's next push, so the last skipped one is still on record.
  if (last_skipped_ && last_skipped_->first == step) skipped = last_skipped_->second;
  return true;
}

void Server::complete_sync_step_if_ready_locked() {
  const int backups = std::get<Sync>(options_.consistency).backup_workers;
  const int needed = std::max(1, active_workers_locked() - backups);
  if (contributors_ == 0 || contributors_ < needed) return;
  const auto overflowed = std::find_if(overflow_shards_.begin(), overflow_shards_.end(), [](std::int32_t shard) { return shard >= 0; });
  if (overflowed != overflow_shards_.end()) {
    // A loss-scaled step that overflowed somewhere: nothing changes, but the step is taken, on every server.
    last_skipped_ = {version_, {.worker = static_cast<int>(overflowed - overflow_shards_.begin()), .shard = *overflowed}};
    ++version_;
    end_sync_step_locked();
    return;
  }
  apply_sync_step_locked();
  end_sync_step_locked();
}

void Server::end_sync_step_locked() {
  deadline_.observe(Clock::now() - step_started_);
  std::fill(contributions_.begin(), contributions_.end(), nullptr);
  std::fill(overflow_shards_.begin(), overflow_shards_.end(), -1);
  contributors_ = 0;
  contributed_samples_ = 0;
  changed_.notify_all();
}

bool Server::push_async_locked(std::unique_lock<std::mutex>& lock, int worker, const proto::RequestHeader& header,
                               const std::vector<float>& payload, std::int64_t& staleness, std::optional<Skip>& skipped) {
  const auto w = static_cast<std::size_t>(worker);
  WorkerCounters& counters = stats_.workers[w];
  staleness = version_ - header.step;
  ++counters.pushes;
  counters.staleness_sum += staleness;
  counters.max_staleness = std::max(counters.max_staleness, staleness);
  if ((header.flags & proto::kNotFinite) != 0)
    skipped = Skip{.worker = worker, .shard = header.overflow_shard};  // this push alone, on every server
  else
    apply_locked(payload.data(), header.samples > 0);
  ++clocks_[w];
  changed_.notify_all();
  if (const auto* bounded = std::get_if<BoundedStaleness>(&options_.consistency)) {
    const std::int64_t bound = bounded->max_staleness;
    if (!wait_locked(lock, [&] { return clocks_[w] - slowest_clock_locked() <= bound; },
                     [&] { return laggards_locked(clocks_[w] - bound); }))
      return false;
  }
  counters.max_lead = std::max(counters.max_lead, clocks_[w] - slowest_clock_locked());
  return true;
}

void Server::apply_sync_step_locked() {
  // In worker order, whatever the arrival order: the same sum, bit for bit, on every run. Trainable: mean
  // gradient x samples, so the step averages over all samples of the global batch; non-trainable: the
  // change of the moving statistics, averaged over the workers. A float times an integer below 2^24 is
  // exact in double, so a fused multiply-add rounds as the separate operations do. The sum starts from
  // 0.0 + the first term (which a compiler may not shorten: -0.0 becomes +0.0) and its last term is added
  // on the way to the optimizer: one pass over the gradients for the usual single contribution per server.
  const timeline::Span span("update", "apply update");
  values_changed_locked();
  std::vector<std::size_t> from;
  for (std::size_t w = 0; w < contributions_.size(); ++w)
    if (contributions_[w] != nullptr) from.push_back(w);
  const double gradient_scale = contributed_samples_ > 0 ? 1.0 / static_cast<double>(contributed_samples_) : 0.0;
  const double delta_scale = 1.0 / contributors_;
  for (Held& held : held_) {
    const bool trainable = held.shard->trainable;
    if (trainable && gradient_scale == 0.0) continue;
    const auto weight_of = [&](std::size_t w) { return trainable ? static_cast<double>(contribution_samples_[w]) : 1.0; };
    double* sum = accumulator_.data() + held.offset;
    const std::int64_t n = held.value.numel();
    for (std::size_t k = 0; k + 1 < from.size(); ++k) {
      const float* in = contributions_[from[k]] + held.offset;
      const double weight = weight_of(from[k]);
      if (k == 0)
        for (std::int64_t i = 0; i < n; ++i) sum[i] = 0.0 + static_cast<double>(in[i]) * weight;
      else
        for (std::int64_t i = 0; i < n; ++i) sum[i] += static_cast<double>(in[i]) * weight;
    }
    const float* last = contributions_[from.back()] + held.offset;
    const double weight = weight_of(from.back());
    const double scale = trainable ? gradient_scale : delta_scale;
    if (from.size() == 1)
      update_locked(held, scale, [&](std::int64_t i) { return 0.0 + static_cast<double>(last[i]) * weight; });
    else
      update_locked(held, scale, [&](std::int64_t i) { return sum[i] + static_cast<double>(last[i]) * weight; });
  }
  finish_update_locked();
}

void Server::apply_locked(const float* source, bool with_gradients) {
  const timeline::Span span("update", "apply update");
  values_changed_locked();
  for (Held& held : held_) {
    if (held.shard->trainable && !with_gradients) continue;
    const float* in = source + held.offset;
    update_locked(held, 1.0, [in](std::int64_t i) { return static_cast<double>(in[i]); });
  }
  finish_update_locked();
}

template <typename Term>
void Server::update_locked(Held& held, double scale, Term term) {
  // Scaled in double and rounded once to float, then added: no product left for the compiler to fuse, so
  // every instruction set gives the same bits.
  const std::int64_t n = held.value.numel();
  if (held.shard->trainable) {
    float* g = held.gradient.data();
    for (std::int64_t i = 0; i < n; ++i) g[i] = static_cast<float>(term(i) * scale);
    optimizer_.apply(held.shard->name(), held.value, held.gradient);
  } else {
    float* v = held.value.data();
    for (std::int64_t i = 0; i < n; ++i) v[i] += static_cast<float>(term(i) * scale);
  }
}

void Server::finish_update_locked() {
  optimizer_.finish_step();
  ++version_;
  ++stats_.updates;
}

void Server::finish_worker_locked(int worker) {
  finished_[static_cast<std::size_t>(worker)] = 1;
  // A worker that leaves may have been the one a Sync step or a bounded wait was waiting for.
  if (std::holds_alternative<Sync>(options_.consistency)) complete_sync_step_if_ready_locked();
  changed_.notify_all();
}

int Server::active_workers_locked() const {
  return static_cast<int>(std::count(finished_.begin(), finished_.end(), 0));
}

std::int64_t Server::slowest_clock_locked() const {
  std::int64_t slowest = std::numeric_limits<std::int64_t>::max();
  for (std::size_t w = 0; w < clocks_.size(); ++w)
    if (!finished_[w]) slowest = std::min(slowest, clocks_[w]);
  return slowest == std::numeric_limits<std::int64_t>::max() ? 0 : slowest;
}

std::string Server::missing_workers_locked(std::int64_t step) const {
  std::string missing;
  for (std::size_t w = 0; w < contributions_.size(); ++w)
    if (contributions_[w] == nullptr && !finished_[w])
      missing += (missing.empty() ? "" : ", ") + transport_.describe(worker_ranks_[w]) + " is stuck";
  return comm::stuck_message(missing, fmt::format("ps {} got no gradients of step {}", server_, step), deadline_.limit());
}

std::string Server::laggards_locked(std::int64_t clock) const {
  std::string behind;
  for (std::size_t w = 0; w < clocks_.size(); ++w)
    if (!finished_[w] && clocks_[w] < clock) behind += (behind.empty() ? "" : ", ") + transport_.describe(worker_ranks_[w]) + " is stuck";
  return comm::stuck_message(behind, fmt::format("ps {} got no push that brings it within the staleness bound", server_),
                             deadline_.limit());
}

template <typename Ready, typename Culprit>
bool Server::wait_locked(std::unique_lock<std::mutex>& lock, Ready ready, Culprit culprit) {
  const auto limit = deadline_.limit();
  const bool in_time = changed_.wait_for(lock, limit, [&] { return ready() || failed_; });
  if (failed_) return false;  // another worker's failure ends serving; serve() reports it
  if (!in_time) throw TimeoutError(culprit());
  return true;
}

std::string Server::overdue_workers(const std::string& reason) const {
  const std::lock_guard lock(mutex_);
  const auto now = Clock::now();
  const auto half = deadline_.limit() / 2;
  const bool step_overdue = std::holds_alternative<Sync>(options_.consistency) && contributors_ > 0 && now - step_started_ >= half;
  std::string overdue;
  for (std::size_t w = 0; w < worker_ranks_.size(); ++w) {
    const std::string name = transport_.describe(worker_ranks_[w]);
    if (finished_[w] || reason.find(name) != std::string::npos) continue;  // done, or the one lost
    std::string why;
    if (step_overdue && contributions_[w] == nullptr)
      why = fmt::format("ps {} got no gradients of step {} for {:.1f} s", server_, version_,
                        std::chrono::duration<double>(now - step_started_).count());
    else if (idle_since_[w] && now - *idle_since_[w] >= half && !comm::waits_on_another(transport_.progress_of(worker_ranks_[w])))
      why = fmt::format("ps {} got no request for {:.1f} s", server_, std::chrono::duration<double>(now - *idle_since_[w]).count());
    if (!why.empty())
      overdue += fmt::format("{}{} is stuck: connected, but {}", overdue.empty() ? "" : "; ", name, why);
  }
  return overdue;
}

void Server::announce_failure(const std::string& reason) {
  proto::ReplyHeader header;
  header.status = static_cast<std::uint16_t>(proto::Status::Failed);
  proto::set_message(header, fmt::format("ps {} failed: {}", server_, reason));
  std::vector<comm::WorkPtr> sends;
  for (std::size_t w = 0; w < worker_ranks_.size(); ++w) {
    if (finished_[w]) continue;
    sends.push_back(transport_.send(worker_ranks_[w], proto::kReplyTag, std::as_bytes(std::span(&header, 1))));
  }
  // Best effort: a worker that is lost or stuck may not take it, and serve() fails either way.
  for (const auto& sent : sends) {
    try {
      sent->wait(transport_.timeout());
    } catch (const Error&) {
    }
  }
}

std::shared_ptr<const Server::Published> Server::published_values_locked(bool checksummed) {
  if (published_) {
    if (checksummed && !published_->crc) published_->crc = crc32c_of(published_->values.data(), published_->values.size() * sizeof(float));
    return published_;
  }
  // Under the lock, once per change: the workers' answers share it, and an update waits for no answer. A
  // retired copy that no answer holds any more (each lets go under the lock) is reused, its pages mapped.
  const auto free = free_retired_locked();
  if (free != retired_.end()) {
    published_ = std::move(*free);
    retired_.erase(free);
  } else {
    published_ = std::make_shared<Published>();
  }
  published_->values.resize(payload_floats_);
  published_->crc.reset();
  std::uint32_t crc = 0;
  for (const Held& held : held_) {
    float* to = published_->values.data() + held.offset;
    if (checksummed)
      crc = crc32c_copy(crc, to, held.value.data(), static_cast<std::size_t>(held.value.numel()) * sizeof(float));
    else
      std::copy_n(held.value.data(), held.value.numel(), to);
  }
  if (checksummed) published_->crc = crc;
  return published_;
}

std::vector<std::shared_ptr<Server::Published>>::iterator Server::free_retired_locked() {
  return std::find_if(retired_.begin(), retired_.end(), [](const auto& copy) { return copy.use_count() == 1; });
}

void Server::values_changed_locked() {
  held_values_crc_.reset();
  if (!published_) return;
  retired_.push_back(std::move(published_));
  // One per worker can still be on its way (asynchronous pushes); more are let go once free.
  if (retired_.size() > worker_ranks_.size()) {
    const auto free = free_retired_locked();
    if (free != retired_.end()) retired_.erase(free);
  }
}

ServerSnapshot Server::snapshot_locked() const {
  ServerSnapshot snapshot{.server = server_, .servers = plan_.servers(), .step = version_, .optimizer = optimizer_.name(),
                          .iterations = optimizer_.iterations()};
  for (const Held& held : held_) {
    SavedShard saved{.variable = held.shard->variable, .row_begin = held.shard->row_begin, .row_end = held.shard->row_end,
                     .trainable = held.shard->trainable, .value = held.value.clone()};
    const auto& state = optimizer_.state();
    if (const auto it = state.find(held.shard->name()); it != state.end())
      for (const Tensor& slot : it->second.slots) saved.slots.push_back(slot.clone());
    snapshot.shards.push_back(std::move(saved));
  }
  return snapshot;
}

void Server::refuse(int worker, const std::string& reason) {
  log::warning("ps {}: refused a request from {}: {}; that worker is no longer served", server_,
               transport_.describe(worker_ranks_[static_cast<std::size_t>(worker)]), reason);
  {
    const std::lock_guard lock(mutex_);
    ++stats_.refused;
    finish_worker_locked(worker);
  }
  proto::ReplyHeader header;
  header.status = static_cast<std::uint16_t>(proto::Status::Refused);
  proto::set_message(header, fmt::format("ps {} refused the request: {}", server_, reason));
  transport_.send(worker_ranks_[static_cast<std::size_t>(worker)], proto::kReplyTag, bytes_of(header))->wait(transport_.timeout());
}

void Server::answer_values(std::unique_lock<std::mutex>& lock, int worker, std::int64_t staleness,
                           const std::optional<Skip>& skipped, bool in_place) {
  // Under Sync without backup workers a step completes only once every worker still served has asked
  // again, which it does after it has its last answer: the held values stay unchanged until then, and an
  // answer sends them, or names them in place, uncopied. Otherwise the answers share a published copy.
  const auto* sync = std::get_if<Sync>(&options_.consistency);
  const bool from_held = sync != nullptr && sync->backup_workers == 0;
  std::shared_ptr<const Published> values;
  std::uint32_t crc = 0;
  if (!from_held) {
    values = published_values_locked(!in_place);
    crc = values->crc.value_or(0);
  } else if (!in_place) {
    crc = held_values_crc_locked();
  }
  lock.unlock();
  // One piece per shard: where it lies (in place), or its bytes as a message of its own.
  std::vector<std::span<const std::byte>> pieces;
  for (const Held& held : held_) {
    const float* from = from_held ? held.value.data() : values->values.data() + held.offset;
    pieces.push_back(std::as_bytes(std::span(from, static_cast<std::size_t>(held.value.numel()))));
  }
  if (in_place) {
    auto ranges = std::make_shared<std::vector<proto::MemoryRange>>();
    for (const auto& piece : pieces) ranges->push_back({.address = reinterpret_cast<std::uintptr_t>(piece.data()), .bytes = piece.size()});
    if (values) {
      const std::lock_guard lent(mutex_);
      lent_[static_cast<std::size_t>(worker)] = values;  // until the worker's next request
    }
    const auto payload = std::as_bytes(std::span(*ranges));
    try {
      reply(worker, staleness, std::span(&payload, 1), crc32c_of(payload.data(), payload.size()), skipped, payload_floats_ * sizeof(float));
    } catch (...) {
      comm::keep_until_exit(std::move(ranges));  // a send that did not finish may still read them
      throw;
    }
  } else {
    try {
      reply(worker, staleness, pieces, crc, skipped);
    } catch (...) {
      if (values) comm::keep_until_exit(std::const_pointer_cast<Published>(values));  // a send that did not finish may still read it
      throw;
    }
  }
  if (!values) return;
  // Let go under the lock: the thread that next sees the copy free and reuses it then sees the send done.
  lock.lock();
  values.reset();
}

std::uint32_t Server::held_values_crc_locked() {
  if (!held_values_crc_) {
    std::uint32_t crc = 0;
    for (const Held& held : held_)
      crc = crc32c_extend(crc, held.value.data(), static_cast<std::size_t>(held.value.numel()) * sizeof(float));
    held_values_crc_ = crc;
  }
  return *held_values_crc_;
}

void Server::reply(int worker, std::int64_t staleness, std::span<const std::byte> payload, std::uint32_t crc) {
  reply(worker, staleness, std::span(&payload, 1), crc, {});
}

void Server::reply(int worker, std::int64_t staleness, std::span<const std::span<const std::byte>> payload, std::uint32_t crc,
                   const std::optional<Skip>& skipped, std::optional<std::size_t> values_in_place) {
  const int rank = worker_ranks_[static_cast<std::size_t>(worker)];
  std::size_t bytes = 0;
  for (const auto& piece : payload) bytes += piece.size();
  proto::ReplyHeader header;
  if (skipped) {
    header.flags |= proto::kStepSkipped;
    header.overflow_worker = skipped->worker;
    header.overflow_shard = skipped->shard;
  }
  if (values_in_place) header.flags |= proto::kValuesInPlace;
  if (worker_memory_ != nullptr) header.flags |= proto::kReadsYourMemory;
  {
    const std::lock_guard lock(mutex_);
    header.step = version_;
    header.optimizer_iterations = optimizer_.iterations();
    if (run_ended_) header.flags |= proto::kRunEnded;
    header.learning_rate_factor = optimizer_.learning_rate_factor();
    stats_.bytes_out += static_cast<std::int64_t>(sizeof header + values_in_place.value_or(bytes));
  }
  header.staleness = staleness;
  header.payload_bytes = bytes;
  header.payload_crc = crc;
  auto sent_header = std::make_shared<proto::ReplyHeader>(header);  // outlives a send that fails to finish
  std::vector<comm::WorkPtr> sends{transport_.send(rank, proto::kReplyTag, bytes_of(*sent_header))};
  for (const auto& piece : payload)
    if (!piece.empty()) sends.push_back(transport_.send(rank, proto::kReplyPayloadTag, piece));
  try {
    comm::wait_all(sends, transport_.timeout());
  } catch (...) {
    comm::keep_until_exit(std::move(sent_header));
    throw;
  }
}

void Server::record_latency(double milliseconds) {
  const std::lock_guard lock(mutex_);
  latency_sum_ms_ += milliseconds;
  ++latency_count_;
  if (latencies_ms_.size() < kLatencyWindow) {
    latencies_ms_.push_back(milliseconds);
  } else {
    latencies_ms_[latency_next_] = milliseconds;
    latency_next_ = (latency_next_ + 1) % kLatencyWindow;
  }
}

ServerStats Server::stats_locked() const {
  ServerStats stats = stats_;
  stats.mean_latency_ms = latency_count_ > 0 ? latency_sum_ms_ / static_cast<double>(latency_count_) : 0.0;
  if (!latencies_ms_.empty()) {
    std::vector<double> sorted = latencies_ms_;
    const auto rank = static_cast<std::size_t>(std::ceil(0.99 * static_cast<double>(sorted.size()))) - 1;
    std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(rank), sorted.end());
    stats.p99_latency_ms = sorted[rank];
  }
  return stats;
}

ServerStats Server::stats() const {
  const std::lock_guard lock(mutex_);
  return stats_locked();
}

std::vector<float> Server::value_of(const std::string& shard_name) const {
  const std::lock_guard lock(mutex_);
  for (const Held& held : held_)
    if (held.shard->name() == shard_name) return held.value.to_vector();
  throw InvalidArgument(fmt::format("ps {} holds no shard '{}'", server_, shard_name));
}

}  // namespace cohort::ps
