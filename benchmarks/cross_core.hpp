#pragma once
// The ceiling of any exchange between two ranks on one host: two threads pinned to two cores of this
// process's CPU set, how long a cache line takes to go from one core to the other and back, and how fast
// one core copies bytes that the other has just written (the one copy a message between them must take).
// On a virtual machine both move with where the hypervisor puts its cores: on the 2-core hosts here a
// round trip of about 100 ns went with 13-14 GB/s for a 2-rank shared-memory allreduce at 1 MiB, one of
// about 500 ns with 2 GB/s, for cohort and Open MPI alike, switching every few seconds. Ratios between
// runs hold only where the round trip stayed the same (allreduce_compare.sh measures it before and after).
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "allreduce_sweep.hpp"

namespace sweep {

// The first two CPUs this process may run on; none on a single CPU.
inline std::optional<std::pair<int, int>> two_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return std::nullopt;
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE && cpus.size() < 2; ++cpu)
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  if (cpus.size() < 2) return std::nullopt;
  return std::pair{cpus[0], cpus[1]};
}

inline bool pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

// The turns of the two threads: `sent` counts what the reader asked for, `taken` what the writer answered, each
// on its own cache line, so that a round trip moves exactly two lines. `fill` (set before `sent`) is how many
// bytes of `from` the writer fills with the turn's byte before it answers: none for a ping.
struct Turns {
  alignas(64) std::atomic<long> sent{0};
  alignas(64) std::atomic<long> taken{0};
  alignas(64) std::atomic<bool> stop{false};
  std::size_t fill = 0;
};

inline char byte_of(long turn) { return static_cast<char>(turn & 0x7f); }

// The reader's half of a turn: asks for it and waits for the answer.
inline void take_turn(Turns& turns, long turn) {
  turns.sent.store(turn, std::memory_order_release);
  while (turns.taken.load(std::memory_order_acquire) < turn) {
  }
}

// Median round trip in nanoseconds over batches of a few thousand; the caller is pinned to one core and the
// writer (already started, pinned to the other) answers every ping.
inline double round_trip_ns(Turns& turns, long& turn) {
  using Clock = std::chrono::steady_clock;
  constexpr int kBatches = 15, kPerBatch = 4000;
  std::vector<double> batches;
  for (int b = 0; b < kBatches; ++b) {
    const auto start = Clock::now();
    for (int i = 0; i < kPerBatch; ++i) take_turn(turns, ++turn);
    batches.push_back(std::chrono::duration<double, std::nano>(Clock::now() - start).count() / kPerBatch);
  }
  std::nth_element(batches.begin(), batches.begin() + kBatches / 2, batches.end());
  return batches[kBatches / 2];
}

// Prints the round trip, then the sweep's table for the copies: per size, the time the reader's core takes
// to copy what the writer's core has just written (the writer's own writing not counted).
inline int cross_core_ceiling(const Options& options) {
  using Clock = std::chrono::steady_clock;
  const auto cores = two_cores();
  if (!cores) {
    std::printf("# core to core: this process may run on one CPU only, so there is no cross-core ceiling\n");
    return 0;
  }
  std::vector<char> from(options.max_bytes), to(options.max_bytes);
  Turns turns;
  std::thread writer([&] {
    pin_to(cores->second);
    long answered = 0;
    while (!turns.stop.load(std::memory_order_acquire)) {
      const long turn = turns.sent.load(std::memory_order_acquire);
      if (turn == answered) continue;
      answered = turn;
      std::memset(from.data(), byte_of(turn), turns.fill);
      turns.taken.store(turn, std::memory_order_release);
    }
  });
  if (!pin_to(cores->first)) std::printf("# (the reader could not be pinned to CPU %d)\n", cores->first);
  long turn = 0;
  const double round_trip = round_trip_ns(turns, turn);
  std::printf("# core to core: round trip %.0f ns (CPUs %d and %d)\n", round_trip, cores->first, cores->second);
  std::printf("# copy of what the other core just wrote, one thread\n");
  print_columns();
  bool all_correct = true;
  for (std::size_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= 2) {
    const int iterations = iterations_for(bytes) + 1;  // the first maps the pages and is not timed
    double seconds = 0;
    bool correct = true;
    for (int i = 0; i < iterations; ++i) {
      turns.fill = bytes;
      take_turn(turns, ++turn);
      const auto start = Clock::now();
      std::memcpy(to.data(), from.data(), bytes);
      if (i > 0) seconds += std::chrono::duration<double>(Clock::now() - start).count();
      const char expected = byte_of(turn);
      correct = correct && to[0] == expected && to[bytes / 2] == expected && to[bytes - 1] == expected;
    }
    seconds /= iterations - 1;
    all_correct = all_correct && correct;
    print_row(bytes, bytes, seconds, 1.0, correct);
  }
  turns.stop.store(true, std::memory_order_release);
  writer.join();
  return all_correct ? 0 : 3;
}

}  // namespace sweep
