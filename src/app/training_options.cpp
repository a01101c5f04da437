#include "cohort/app/training_options.hpp"

#include <CLI/CLI.hpp>

#include "cohort/app/command_line.hpp"

#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include <stdlib.h>
#include <unistd.h>

#include "cohort/cluster/cluster.hpp"
#include "cohort/core/check.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/logging.hpp"
#include "cohort/core/settings.hpp"
#include "cohort/data/idx.hpp"
#include "cohort/nn/model_file.hpp"
#include "cohort/ps/consistency.hpp"
#include "cohort/ps/placement.hpp"
#include "cohort/tensor/devices.hpp"
#include "cohort/tensor/gemm_path.hpp"
#include "cohort/train/gradient_codec.hpp"
#include "cohort/train/run_report.hpp"
#include "cohort/train/tensorboard.hpp"

namespace cohort::app {
namespace {

// A CLI11 validator from a parser that throws InvalidArgument: the same words as the library's errors.
template <class Parse>
CLI::Validator accepted_by(std::string description, Parse parse) {
  return CLI::Validator(
      [parse](std::string& text) -> std::string {
        try {
          parse(text);
          return {};
        } catch (const cohort::InvalidArgument& e) {
          return e.what();
        }
      },
      std::move(description));
}

}  // namespace

TrainingOptions parse_training_options(int argc, const char* const* argv, std::string_view purpose, TrainingOptions defaults) {
  TrainingOptions options = defaults;
  CLI::App cli{std::string(purpose)};
  cli.option_defaults()->always_capture_default();
  cli.add_option("--epochs", options.epochs, "epochs to train")->check(whole_number(1, std::int64_t{1} << 40));
  cli.add_option("--batch-size", options.batch_size, "samples per batch per worker")->check(whole_number(1, 1 << 24));
  cli.add_option("--accumulate-steps", options.accumulate_steps,
                 "backward passes per update: the update equals one step at N x the batch size")
      ->check(whole_number(1, 1 << 20));
  cli.add_option("--max-steps", options.max_steps, "stop after N optimizer steps (0: no limit)")
      ->check(whole_number(0, std::int64_t{1} << 62));
  cli.add_option("--train-samples", options.train_samples, "train on the first N samples only (0: all)")
      ->check(whole_number(0, std::int64_t{1} << 62));
  cli.add_option("--data-dir", options.data_dir, "data directory (see README.md)");
  cli.add_option("--threads", options.threads, "CPU threads (0: all cores)")->check(whole_number(0, 4096));
  cli.add_option("--device", options.device, "cpu, cuda, auto (CUDA when a GPU is visible) or emulated")
      ->check(CLI::IsMember({"cpu", "cuda", "auto", "emulated"}));
  cli.add_flag("--resident-images", options.resident_images,
               "on a GPU, copy the training set's 8-bit images there once; batches then bring only sample indices");
  cli.add_flag("!--no-capture-steps", options.capture_steps,
               "on a GPU, run every training step op by op instead of replaying each full batch's captured step");
  cli.add_option("--precision", options.precision,
                 "float32, or mixed_bfloat16 / mixed_float16: float32 variables, layers computing in the 16-bit type")
      ->check(CLI::IsMember({"float32", "mixed_bfloat16", "mixed_float16"}));
  cli.add_option("--learning-rate", options.learning_rate, "base learning rate")->check(positive_finite_number());
  cli.add_option("--seed", options.seed, "seed for initialization, data order and augmentation")
      ->check(whole_number(0, std::numeric_limits<std::int64_t>::max()));
  cli.add_option("--checkpoint-dir", options.checkpoint_dir, "write a checkpoint there after every epoch");
  cli.add_option("--checkpoint-every", options.checkpoint_every, "and every N steps")->check(whole_number(0, std::int64_t{1} << 62));
  cli.add_flag("--resume", options.resume, "continue from the checkpoint directory's latest checkpoint");
  cli.add_option("--history-csv", options.history_csv, "write per-epoch metrics as CSV");
  cli.add_option("--save-model", options.save_model, "write a model file for inference (architecture, weights, input "
                                                     "normalization) at the end");
  cli.add_option("--timeline", options.timeline,
                 "write a Chrome trace of the run (chrome://tracing, Perfetto); under cohort-launch, one for the job");
  cli.add_option("--tensorboard", options.tensorboard,
                 "write TensorBoard event files there (train/ and validation/: per-epoch scalars, histograms of the variables)");
  cli.add_option("--tensorboard-every", options.tensorboard_every, "and the batch loss and metrics every N steps")
      ->check(whole_number(0, std::int64_t{1} << 62));
  cli.add_option("--report", options.report,
                 "write an HTML page about the run: curves, step time, learning rate and batch, placement, traffic, model");
  cli.add_option("--verbosity", options.verbosity, "progress: auto (a bar on a terminal), lines, epochs or silent")
      ->check(CLI::IsMember({"auto", "lines", "epochs", "silent"}));
  cli.add_option("--consistency", options.consistency, "parameter servers: sync, sync:backup=N, async or stale:N")
      ->check(accepted_by("CONSISTENCY", [](const std::string& text) { ps::parse_consistency(text); }))
      ->group("Distributed (under cohort-launch)");
  cli.add_option("--placement", options.placement, "round-robin, size-balanced or tensorflow-greedy")
      ->check(accepted_by("POLICY", [](const std::string& text) { ps::parse_policy(text); }))
      ->group("Distributed (under cohort-launch)");
  cli.add_option("--max-shard-bytes", options.max_shard_bytes, "partition variables larger than N bytes across servers")
      ->check(whole_number(0, std::int64_t{1} << 62))
      ->group("Distributed (under cohort-launch)");
  cli.add_flag("--each-worker-full-pass", options.each_worker_full_pass,
               "every worker reads the whole data set per epoch (TensorFlow's way)")
      ->group("Distributed (under cohort-launch)");
  cli.add_flag("--sync-batch-norm", options.sync_batch_norm,
               "batch normalization with the statistics of every worker's batch together (ring allreduce only)")
      ->group("Distributed (under cohort-launch)");
  cli.add_option("--gradient-dtype", options.gradient_dtype,
                 "gradients travel as float32 or bfloat16 (half the bytes; summed in float32), to the servers or around the ring")
      ->check(CLI::IsMember({"float32", "bfloat16"}))
      ->group("Distributed (under cohort-launch)");
  cli.add_option("--shard-optimizer", options.shard_optimizer,
                 "ZeRO under ring allreduce: zero1 shards the optimizer state over the workers, zero2 the reduced gradients too")
      ->check(CLI::IsMember({"none", "zero1", "zero2"}))
      ->group("Distributed (under cohort-launch)");
  cli.add_option("--gradient-codec", options.gradient_codec,
                 "under ring allreduce: powersgd or powersgd:R sends rank-R factors of each gradient matrix (error feedback)")
      ->check(accepted_by("CODEC", [](const std::string& text) {
        if (text != "none") train::parse_codec(text);
      }))
      ->group("Distributed (under cohort-launch)");
  cli.add_option("--lr-scaling", options.lr_scaling, "learning rate x workers: linear, sqrt or none, warmed up over an epoch")
      ->check(CLI::IsMember({"linear", "sqrt", "none"}))
      ->group("Distributed (under cohort-launch)");
  cli.add_flag("--demo", options.demo, "a short run for `make demo`");
  cli.add_flag("--summary", options.summary_only, "print the model summary and exit");
  parse_or_exit(cli, argc, argv);
  // An output that cannot be written fails now, not after the training it would keep.
  for (const auto& [option, output] : {std::pair{"--save-model", &options.save_model}, std::pair{"--history-csv", &options.history_csv},
                                     std::pair{"--report", &options.report}, std::pair{"--timeline", &options.timeline}}) {
    std::error_code looked;
    const auto existing = std::filesystem::status(*output, looked);
    if (!output->empty() && std::filesystem::exists(existing) && !std::filesystem::is_regular_file(existing)) {
      fmt::print(stderr, "{} {}: it exists and is not a regular file\n", option, *output);
      std::exit(2);
    }
    const auto directory = std::filesystem::path(*output).parent_path();
    if (!output->empty() && !directory.empty() && !std::filesystem::is_directory(directory, looked)) {
      fmt::print(stderr, "{} {}: there is no directory {}\n", option, *output, directory.string());
      std::exit(2);
    }
    // Whether a file can be made there is known only by making one (permissions, read-only and special file systems).
    std::string probe = (directory.empty() ? std::string(".") : directory.string()) + "/.cohort-probe-XXXXXX";
    if (output->empty()) continue;
    if (const int fd = ::mkstemp(probe.data()); fd >= 0) {
      ::close(fd);
      ::unlink(probe.c_str());
    } else {
      fmt::print(stderr, "{} {}: no file can be made in {}: {}\n", option, *output,
                 directory.empty() ? "the current directory" : directory.string(), std::strerror(errno));
      std::exit(2);
    }
  }
  if (!options.tensorboard.empty()) {
    std::error_code made;
    std::filesystem::create_directories(options.tensorboard, made);
    if (made || !std::filesystem::is_directory(options.tensorboard)) {
      fmt::print(stderr, "--tensorboard {}: cannot make that directory: {}\n", options.tensorboard,
                 made ? made.message() : "it exists and is not a directory");
      std::exit(2);
    }
  }
  check_settings_or_exit();
  return options;
}

void check_settings_or_exit() {
  try {
    check_settings();
    check_cpu_kernel_settings();
    const cluster::ConnectOptions defaults;
    cluster::with_environment_settings(defaults);  // the deadlines and TLS settings, refused alike before any work
  } catch (const InvalidArgument& e) {
    fmt::print(stderr, "{}\n", e.what());
    std::exit(2);
  }
}

train::ParameterServerOptions distributed_options(const TrainingOptions& options) {
  return {.consistency = ps::parse_consistency(options.consistency),
          .placement = ps::parse_policy(options.placement),
          .max_shard_bytes = options.max_shard_bytes,
          .data = options.each_worker_full_pass ? train::DataPolicy::EachWorkerFullPass : train::DataPolicy::OnePassPerEpoch,
          .gradient_dtype = parse_dtype(options.gradient_dtype).value_or(DType::Float32),
          .zero_stage = options.shard_optimizer == "zero2" ? 2 : options.shard_optimizer == "zero1" ? 1 : 0,
          .codec = options.gradient_codec == "none" ? std::nullopt : std::optional(train::parse_codec(options.gradient_codec))};
}

nn::Precision precision(const TrainingOptions& options) {
  const auto precision = nn::parse_precision(options.precision);
  COHORT_CHECK(precision.has_value(), "--precision {}: not float32, mixed_bfloat16 or mixed_float16", options.precision);
  return *precision;
}

Device training_device(const TrainingOptions& options, train::Strategy& strategy) {
  if (strategy.service() != nullptr) return Device::CPU;  // a server keeps host memory
  const Device device = choose_device(options.device);
  if (options.device == "auto" && device != Device::CUDA)
    log::info("device: {} (auto: {})", device_name(device), device_unavailable_reason(Device::CUDA));
  else
    log::info("device: {}", device_name(device));
  return device;
}

train::FitOptions fit_options(const TrainingOptions& options) {
  train::FitOptions fit;
  fit.epochs = options.epochs;
  fit.max_steps = options.max_steps;
  fit.batch_size = options.batch_size;
  fit.accumulate_steps = options.accumulate_steps;
  fit.seed = options.seed;
  fit.resident_images = options.resident_images;
  fit.capture_steps = options.capture_steps;
  fit.verbosity = verbosity(options);
  fit.checkpoint_dir = options.checkpoint_dir;
  fit.checkpoint_every_steps = options.checkpoint_every;
  fit.resume = options.resume;
  fit.timeline = options.timeline;
  if (!options.report.empty()) fit.callbacks.push_back(std::make_shared<train::RunReport>(train::RunReportOptions{.path = options.report}));
  if (!options.tensorboard.empty())
    fit.callbacks.push_back(std::make_shared<train::TensorBoard>(
        train::TensorBoardOptions{.log_dir = options.tensorboard, .update_every_steps = options.tensorboard_every}));
  return fit;
}

std::int64_t steps_per_epoch(std::int64_t samples, int replicas, const TrainingOptions& options) {
  const std::int64_t batch_of_all_readers = options.batch_size * (options.each_worker_full_pass ? 1 : replicas);
  const std::int64_t passes = (samples + batch_of_all_readers - 1) / batch_of_all_readers;
  return (passes + options.accumulate_steps - 1) / options.accumulate_steps;
}

optim::Schedule scaled_for_workers(optim::Schedule base, int replicas, std::int64_t steps_per_epoch,
                                   const TrainingOptions& options) {
  using optim::ReplicaScaling;
  const ReplicaScaling scaling = options.lr_scaling == "linear" ? ReplicaScaling::Linear
                                 : options.lr_scaling == "none" ? ReplicaScaling::None
                                                                : ReplicaScaling::Sqrt;
  return optim::scaled_for_replicas(std::move(base), replicas, scaling, replicas > 1 ? steps_per_epoch : 0);
}

train::Verbosity verbosity(const TrainingOptions& options) {
  if (options.verbosity == "lines") return train::Verbosity::Lines;
  if (options.verbosity == "epochs") return train::Verbosity::Epochs;
  if (options.verbosity == "silent") return train::Verbosity::Silent;
  return train::Verbosity::Auto;
}

std::filesystem::path fashion_mnist_directory(const std::string& data_dir) {
  const std::filesystem::path directory = data_dir.empty() ? data::FashionMnist::kDebianDirectory : data_dir;
  if (const std::string absent = data::FashionMnist::absence(directory); !absent.empty())
    throw DataError(fmt::format("no Fashion-MNIST data: {} (apt-get install dataset-fashion-mnist puts it in {}; "
                                "--data-dir DIR reads it from another directory)",
                                absent, data::FashionMnist::kDebianDirectory));
  return directory;
}

void write_run_outputs(const TrainingOptions& options, const train::History& history, const nn::Sequential& model,
                       const data::ChannelStatistics& input) {
  if (!options.history_csv.empty()) history.write_csv(options.history_csv);
  if (options.save_model.empty()) return;
  nn::save_model(model, options.save_model, {.input_mean = input.mean, .input_stddev = input.stddev});
  fmt::print("model saved to {}\n", options.save_model);
}

}  // namespace cohort::app
