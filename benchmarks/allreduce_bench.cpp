// An nccl-tests-style sweep of cohort's ring allreduce over the TCP transport: for each size, the mean
// time of repeated float32 sum allreduces, the algorithm bandwidth (bytes / time), the bus bandwidth
// (algbw * 2 (n - 1) / n, what each link carries) and a correctness check against the exact sum. Every
// rank runs it; rank 0 prints. It takes the cluster from the environment, so it runs under cohort-launch:
//
//   ./build/cohort-launch --workers 4 -- ./build/benchmarks/cohort_allreduce_bench
//   ... --min-bytes 4096 --max-bytes 268435456     (defaults)
//   ... --forever                                  (repeat the sweep until stopped; for failure drills)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <cohort/cohort.hpp>

using namespace cohort;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::size_t min_bytes = 4096, max_bytes = std::size_t{256} << 20;
  bool forever = false;
};

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::size_t {
      if (i + 1 >= argc) throw InvalidArgument(arg + " needs a value");
      return std::strtoull(argv[++i], nullptr, 10);
    };
    if (arg == "--min-bytes") options.min_bytes = value();
    else if (arg == "--max-bytes") options.max_bytes = value();
    else if (arg == "--forever") options.forever = true;
    else if (arg == "--help") {
      std::printf("usage: %s [--min-bytes N] [--max-bytes N] [--forever]\n", argv[0]);
      std::exit(0);
    } else throw InvalidArgument("unknown option " + arg);
  }
  if (options.min_bytes < 4 || options.max_bytes < options.min_bytes) throw InvalidArgument("bad size range");
  return options;
}

// Exact in float32: every partial sum is an integer below 2^24.
float value_of(int rank, std::size_t i) { return static_cast<float>((rank + 1) * static_cast<int>(i % 1000)); }

bool correct_allreduce(comm::Transport& transport, std::vector<float>& data) {
  const int n = transport.size(), r = transport.rank();
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = value_of(r, i);
  comm::allreduce(transport, data);
  const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
  for (std::size_t i = 0; i < data.size(); ++i)
    if (data[i] != ranks_sum * static_cast<float>(i % 1000)) return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options options = parse(argc, argv);
  auto cluster = cluster::Cluster::from_environment();
  comm::Transport& transport = cluster.transport();
  const int n = transport.size();
  const bool printer = transport.rank() == 0;
  if (printer) {
    std::printf("# cohort ring allreduce, float32 sum, %d ranks over TCP\n", n);
    std::printf("# %12s %12s %12s %12s %12s %8s\n", "size(B)", "count", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "correct");
  }
  bool all_correct = true;
  do {
    for (std::size_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= 2) {
      std::vector<float> data(bytes / sizeof(float), 1.0f);
      // Enough repetitions for about 64 MiB of traffic per size, at least 3 and at most 50.
      const int iterations = static_cast<int>(std::clamp<std::size_t>((std::size_t{64} << 20) / bytes, 3, 50));
      comm::allreduce(transport, data);  // warm-up
      comm::barrier(transport);
      const auto start = Clock::now();
      for (int i = 0; i < iterations; ++i) comm::allreduce(transport, data);
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count() / iterations;
      // Every rank's verdict, so that rank 0 reports a failure anywhere.
      const float verdict = correct_allreduce(transport, data) ? 0.0f : 1.0f;
      std::vector<float> failures{verdict};
      comm::allreduce(transport, failures);
      const bool correct = failures[0] == 0.0f;
      all_correct = all_correct && correct;
      if (printer) {
        const double algbw = static_cast<double>(bytes) / seconds / 1e9;
        const double busbw = algbw * 2.0 * (n - 1) / n;
        std::printf("  %12zu %12zu %12.1f %12.3f %12.3f %8s\n", bytes, data.size(), seconds * 1e6, algbw, busbw,
                    correct ? "yes" : "NO");
        std::fflush(stdout);
      }
    }
  } while (options.forever);
  return all_correct ? 0 : 3;
} catch (const std::exception& e) {
  std::fprintf(stderr, "cohort_allreduce_bench: %s\n", e.what());
  return 1;
}
