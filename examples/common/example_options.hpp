#pragma once
// Command-line options shared by the examples: --epochs, --batch-size, --data-dir, --threads, --device,
// --summary, --help and a few more. Unknown or malformed options end the program with a usage message.

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

namespace examples {

struct ExampleOptions {
  std::int64_t epochs = 5;
  std::int64_t batch_size = 64;
  std::int64_t max_steps = 0;
  std::int64_t train_samples = 0;  // 0: the whole training set
  std::string data_dir;
  int threads = 0;
  std::string device = "auto";
  double learning_rate = 1e-3;
  std::uint64_t seed = 1;
  bool summary_only = false;
  bool demo = false;
  std::string checkpoint_dir;
  bool resume = false;
  std::string history_csv;
  // Distributed runs (cohort-launch): see train::strategy_for
  std::string consistency = "sync";
  std::string placement = "size-balanced";
  std::int64_t max_shard_bytes = 0;
  bool each_worker_full_pass = false;
  std::string lr_scaling = "sqrt";
  std::int64_t checkpoint_every = 0;
};

inline void print_usage(const char* program, const char* purpose, const ExampleOptions& d) {
  fmt::print(
      "usage: {} [options]\n{}\n\n"
      "  --epochs N          epochs to train (default {})\n"
      "  --batch-size N      samples per batch (default {})\n"
      "  --max-steps N       stop after N optimizer steps (default: no limit)\n"
      "  --train-samples N   train on the first N samples only (default: all)\n"
      "  --data-dir DIR      data directory (see README.md)\n"
      "  --threads N         CPU threads (default: all cores)\n"
      "  --device D          cpu, cuda or auto: CUDA when a GPU is visible (default auto); emulated checks\n"
      "                      a program's device transfers on the CPU\n"
      "  --learning-rate X   Adam learning rate (default {})\n"
      "  --seed N            seed for initialization, data order and augmentation (default {})\n"
      "  --checkpoint-dir D  write a checkpoint to D after every epoch\n"
      "  --checkpoint-every N  and every N steps\n"
      "  --resume            continue from D/latest.ckpt when it exists\n"
      "  --history-csv FILE  write per-epoch metrics as CSV\n"
      "distributed (under cohort-launch):\n"
      "  --consistency C     parameter servers: sync, sync:backup=N, async or stale:N (default sync)\n"
      "  --placement P       round-robin, size-balanced or tensorflow-greedy (default size-balanced)\n"
      "  --max-shard-bytes N partition variables larger than N bytes across servers\n"
      "  --each-worker-full-pass  every worker reads the whole data set per epoch (TensorFlow's way)\n"
      "  --lr-scaling S      learning rate x workers: linear, sqrt or none (default sqrt), warmed up over an epoch\n"
      "  --demo              a short run for `make demo`\n"
      "  --summary           print the model summary and exit\n"
      "  --help              print this help and exit\n",
      program, purpose, d.epochs, d.batch_size, d.learning_rate, d.seed);
}

inline ExampleOptions parse_options(int argc, char** argv, const char* purpose, ExampleOptions options) {
  const ExampleOptions defaults = options;
  auto fail = [&](const std::string& message) {
    fmt::print(stderr, "{}: {}\n", argv[0], message);
    print_usage(argv[0], purpose, defaults);
    std::exit(2);
  };
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) fail(fmt::format("{} needs a value", argv[i]));
    return argv[++i];
  };
  auto number = [&](int& i) -> std::int64_t {
    const std::string flag = argv[i];
    const std::string text = value(i);
    char* end = nullptr;
    errno = 0;
    const long long parsed = std::strtoll(text.c_str(), &end, 10);
    if (end == text.c_str() || *end != '\0' || parsed < 0 || errno == ERANGE)
      fail(fmt::format("{} needs a non-negative integer, got '{}'", flag, text));
    return parsed;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      print_usage(argv[0], purpose, defaults);
      std::exit(0);
    } else if (arg == "--epochs") options.epochs = number(i);
    else if (arg == "--batch-size") options.batch_size = number(i);
    else if (arg == "--max-steps") options.max_steps = number(i);
    else if (arg == "--train-samples") options.train_samples = number(i);
    else if (arg == "--data-dir") options.data_dir = value(i);
    else if (arg == "--threads") {
      const std::int64_t threads = number(i);
      if (threads > 4096) fail(fmt::format("--threads takes 0 (all cores) to 4096, got {}", threads));
      options.threads = static_cast<int>(threads);
    }
    else if (arg == "--device") {
      options.device = value(i);
      if (options.device != "cpu" && options.device != "cuda" && options.device != "auto" && options.device != "emulated")
        fail("--device takes cpu, cuda, auto or emulated");
    } else if (arg == "--seed") options.seed = static_cast<std::uint64_t>(number(i));
    else if (arg == "--learning-rate") {
      const std::string text = value(i);
      char* end = nullptr;
      options.learning_rate = std::strtod(text.c_str(), &end);
      if (end == text.c_str() || *end != '\0' || !(options.learning_rate > 0) || !std::isfinite(options.learning_rate))
        fail(fmt::format("--learning-rate needs a positive finite number, got '{}'", text));
    } else if (arg == "--checkpoint-dir") options.checkpoint_dir = value(i);
    else if (arg == "--resume") options.resume = true;
    else if (arg == "--history-csv") options.history_csv = value(i);
    else if (arg == "--checkpoint-every") options.checkpoint_every = number(i);
    else if (arg == "--consistency") options.consistency = value(i);
    else if (arg == "--placement") options.placement = value(i);
    else if (arg == "--max-shard-bytes") options.max_shard_bytes = number(i);
    else if (arg == "--each-worker-full-pass") options.each_worker_full_pass = true;
    else if (arg == "--lr-scaling") {
      options.lr_scaling = value(i);
      if (options.lr_scaling != "linear" && options.lr_scaling != "sqrt" && options.lr_scaling != "none")
        fail("--lr-scaling takes linear, sqrt or none");
    }
    else if (arg == "--demo") options.demo = true;
    else if (arg == "--summary") options.summary_only = true;
    else fail(fmt::format("unknown option '{}'", arg));
  }
  if (options.batch_size == 0) fail("--batch-size must be positive");
  return options;
}

}  // namespace examples
