#pragma once
// Chooses by timing, per power-of-two size, between the allreduce by messages and the direct allreduce
// (from the peers' memory) where two ranks share a host. Which of them leads there depends on the machine:
// on a Zen 4 EPYC the ring through the shared-memory rings led up to 8 MiB (12-14 GB/s against 10 at
// 2-4 MiB), on a Sapphire Rapids Xeon the direct allreduce led from 2 MiB (6.7-7.8 GB/s against 4.1-6.5 at
// 2-4 MiB), so a fixed threshold is wrong on one of them. The direct allreduce's pieces differ the same way:
// 1 MiB led on the EPYC with the cores far apart, 256 KiB on the Xeon (1.1-1.2x at 4-16 MiB), so both are
// candidates. On two ranks every algorithm adds a + b once per element, so the choice never changes the
// bits (NaN payloads aside).
//
// The first calls of each size band take the candidates in turn (real allreduces: none spent on timing alone),
// each rank timing its own; after the last trial both ranks add up their best times per algorithm in one
// small exchange, so that both keep the same one. A communicator holds one (AllreduceOptions::timings); the
// calls are collective, so both ranks count the same trials. On any number of ranks it also keeps the
// group's verdict on whether some host is short of cores, from which the ring's segments and, on 3 or more
// ranks sharing memory, where the direct allreduce takes over follow alike on every rank.
#include <array>
#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

namespace cohort::comm {

class AllreduceTimings {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  // The direct allreduce in its default pieces (1 MiB where each rank has a core), or in 256 KiB ones.
  enum class Algorithm { Messages, Direct, DirectFinePieces };
  static constexpr int kCandidates = 3;

  // Sizes outside [kTimedFrom, kTimedBelow) keep the fixed thresholds: below, the messages lead on every
  // machine measured (fewer rounds); from 64 MiB the direct allreduce does (the rings stream in pieces).
  static constexpr std::size_t kTimedFrom = std::size_t{1} << 20, kTimedBelow = std::size_t{64} << 20;
  // Messages, direct, direct in fine pieces, messages, ...: each one's best of four counts. With two each, the
  // first calls' faults and cold caches kept the ring at 2-4 MiB on the Xeon, where the direct allreduce leads
  // once warm.
  static constexpr int kTrials = 4 * kCandidates;

  explicit AllreduceTimings(Clock clock = std::chrono::steady_clock::now) : clock_(std::move(clock)) {}

  static bool timed(std::size_t bytes) { return bytes >= kTimedFrom && bytes < kTimedBelow; }

  // What the next allreduce of `bytes` (a timed size) runs, and whether it is a trial.
  struct Next {
    Algorithm algorithm;
    bool trial;
  };
  Next next(std::size_t bytes);
  // A trial's time on this rank, per byte, since a band holds sizes up to twice apart (`ran` false: the direct
  // allreduce was refused by some rank, and counts as never finishing); false while more trials of its band
  // are to come, true after the last, when the caller adds this rank's best times (best_seconds_per_byte())
  // over the ranks and hands them to settle().
  bool record(std::size_t bytes, std::chrono::steady_clock::time_point began, bool ran = true);
  std::array<float, kCandidates> best_seconds_per_byte(std::size_t bytes) const;
  // Keeps the algorithm whose summed best time is lowest (the earlier candidate on a tie); returns it.
  Algorithm settle(std::size_t bytes, std::array<float, kCandidates> summed_seconds_per_byte);
  // The algorithm kept for `bytes`, once its trials are done.
  std::optional<Algorithm> settled(std::size_t bytes) const;

  std::chrono::steady_clock::time_point now() const { return clock_(); }

  // Whether some rank's host has fewer cores than ranks, once the group agreed on it (collectives.cpp).
  std::optional<bool> short_of_cores() const;
  // Keeps the group's verdict; returns it.
  bool keep_short_of_cores(bool short_of_cores);

 private:
  struct Band {
    int trials = 0;
    std::array<float, kCandidates> best_seconds_per_byte{-1.0f, -1.0f, -1.0f};
    std::optional<Algorithm> kept;
  };
  static int band_of(std::size_t bytes);

  Clock clock_;
  mutable std::mutex mutex_;  // the executor's thread times and agrees, the caller's thread names the algorithm
  std::map<int, Band> bands_;
  std::optional<bool> short_of_cores_;
};

}  // namespace cohort::comm
