#pragma once
// The nccl-tests-style sweep shared by cohort's allreduce benchmark and its peers (Open MPI, Gloo), so
// that all print the same table: size, count, mean time, algbw = bytes / time, busbw = algbw * 2 (n-1) / n
// (the traffic on each link of a ring), and whether the result equals the exact sum on every rank.
// memcpy_ceiling() prints the same table for one memcpy per size: the ceiling for ranks on one host.
// With --startup, a program reports instead how long its processes took from main() to the end of their
// first allreduce (joining the group and making the connections that allreduce needs), and the file
// descriptors each then holds (report_startup()).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace sweep {

struct Options {
  std::size_t min_bytes = 4096, max_bytes = std::size_t{256} << 20;
  bool forever = false;  // repeat until stopped, for failure drills
  bool memcpy_only = false;  // memcpy_ceiling() instead of an allreduce
  bool cores_only = false;   // cross_core_ceiling() (cross_core.hpp) instead of an allreduce
  bool startup = false;      // report_startup() instead of the sweep
  int least_warm_up = 0;     // calls an allreduce spends choosing its algorithm, kept out of the timing
};

inline Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::size_t {
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      return std::strtoull(argv[++i], nullptr, 10);
    };
    if (arg == "--min-bytes") options.min_bytes = value();
    else if (arg == "--max-bytes") options.max_bytes = value();
    else if (arg == "--forever") options.forever = true;
    else if (arg == "--memcpy") options.memcpy_only = true;
    else if (arg == "--cores") options.cores_only = true;
    else if (arg == "--startup") options.startup = true;
    else if (arg == "--help") {
      std::printf("usage: %s [--min-bytes N] [--max-bytes N] [--forever] [--memcpy] [--cores] [--startup]\n", argv[0]);
      std::exit(0);
    } else throw std::invalid_argument("unknown option " + arg);
  }
  if (options.min_bytes < 4 || options.max_bytes < options.min_bytes) throw std::invalid_argument("bad size range");
  return options;
}

// About 64 MiB of traffic per size, at least 3 and at most 1000 repetitions.
inline int iterations_for(std::size_t bytes) {
  return static_cast<int>(std::clamp<std::size_t>((std::size_t{64} << 20) / bytes, 3, 1000));
}

// The table every sweep prints (allreduce_compare.sh reads it): its column heads, and one size's row, where
// busbw = algbw * `bus_factor` (2 (n - 1) / n for an allreduce of n ranks, 1 for a copy).
inline void print_columns() {
  std::printf("# %12s %12s %12s %12s %12s %8s\n", "size(B)", "count", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "correct");
}
inline void print_row(std::size_t bytes, std::size_t count, double seconds, double bus_factor, bool correct) {
  const double algbw = static_cast<double>(bytes) / seconds / 1e9;
  std::printf("  %12zu %12zu %12.1f %12.3f %12.3f %8s\n", bytes, count, seconds * 1e6, algbw, algbw * bus_factor,
              correct ? "yes" : "NO");
  std::fflush(stdout);
}

inline void memcpy_ceiling(const Options& options) {
  using Clock = std::chrono::steady_clock;
  std::printf("# memcpy, one thread\n");
  print_columns();
  for (std::size_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= 2) {
    std::vector<char> from(bytes, 1), to(bytes, 0);
    const int iterations = iterations_for(bytes);
    std::memcpy(to.data(), from.data(), bytes);  // warm-up: pages mapped
    const auto start = Clock::now();
    for (int i = 0; i < iterations; ++i) {
      from[static_cast<std::size_t>(i) % bytes] = static_cast<char>(i);  // each copy is a new one
      std::memcpy(to.data(), from.data(), bytes);
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count() / iterations;
    print_row(bytes, bytes, seconds, 1.0, std::equal(from.begin(), from.end(), to.begin()));
  }
}

inline int open_descriptors() {
  int count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++count;
  return count - 1;  // the directory's own
}

inline long shared_memory_kib() {  // the host's, as /proc/meminfo counts it
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  long value = 0;
  while (meminfo >> key >> value >> unit)
    if (key == "Shmem:") return value;
  return -1;
}

// Each rank's time since `began` (main()) to the end of its first allreduce, after which it counts its
// descriptors; rank 0 prints the slowest and the median, the most descriptors, and the host's shared memory.
template <typename Allreduce, typename Barrier>
int report_startup(std::chrono::steady_clock::time_point began, int rank, int size, Allreduce&& allreduce, Barrier&& barrier) {
  float token = 1;
  allreduce(&token, 1);
  const double ready_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
  std::vector<float> figures(2 * static_cast<std::size_t>(size), 0.0f);
  figures[2 * static_cast<std::size_t>(rank)] = static_cast<float>(ready_ms);
  figures[2 * static_cast<std::size_t>(rank) + 1] = static_cast<float>(open_descriptors());
  allreduce(figures.data(), figures.size());
  barrier();
  if (rank == 0) {
    std::vector<float> ready, descriptors;
    for (int r = 0; r < size; ++r) {
      ready.push_back(figures[2 * static_cast<std::size_t>(r)]);
      descriptors.push_back(figures[2 * static_cast<std::size_t>(r) + 1]);
    }
    std::sort(ready.begin(), ready.end());
    std::printf("startup: %d ranks, ready after %.1f ms (median %.1f ms), at most %.0f descriptors per process, "
                "host shared memory %.1f MiB\n",
                size, ready.back(), ready[ready.size() / 2], *std::max_element(descriptors.begin(), descriptors.end()),
                static_cast<double>(shared_memory_kib()) / 1024);
  }
  return token == static_cast<float>(size) ? 0 : 3;
}

// allreduce(float* data, std::size_t count) sums in place across ranks; barrier() synchronizes.
// Returns 0 when every result was correct.
template <typename Allreduce, typename Barrier>
int run(const char* title, int rank, int size, const Options& options, Allreduce&& allreduce, Barrier&& barrier) {
  using Clock = std::chrono::steady_clock;
  const bool printer = rank == 0;
  if (printer) {
    std::printf("# %s, float32 sum, %d ranks\n", title, size);
    print_columns();
  }
  bool all_correct = true;
  do {
    for (std::size_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= 2) {
      std::vector<float> data(bytes / sizeof(float), 1.0f);
      const int iterations = iterations_for(bytes);
      // Warm-up, as nccl-tests' five (pages mapped), and a whole size's worth before the first size, so that
      // it does not also time the group settling after its start (links paired, threads scheduled).
      const int warm_up = std::max(bytes == options.min_bytes ? iterations : std::min(iterations, 5), options.least_warm_up);
      for (int i = 0; i < warm_up; ++i) allreduce(data.data(), data.size());
      barrier();
      const auto start = Clock::now();
      for (int i = 0; i < iterations; ++i) allreduce(data.data(), data.size());
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count() / iterations;
      // Exact in float32: every partial sum is an integer below 2^24.
      for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 1000));
      allreduce(data.data(), data.size());
      const float ranks = static_cast<float>(size * (size + 1) / 2);
      float wrong = 0.0f;
      for (std::size_t i = 0; i < data.size(); ++i) wrong += data[i] != ranks * static_cast<float>(i % 1000) ? 1.0f : 0.0f;
      allreduce(&wrong, 1);  // every rank's verdict
      const bool correct = wrong == 0.0f;
      all_correct = all_correct && correct;
      if (printer) print_row(bytes, data.size(), seconds, 2.0 * (size - 1) / size, correct);
    }
  } while (options.forever);
  return all_correct ? 0 : 3;
}

}  // namespace sweep
