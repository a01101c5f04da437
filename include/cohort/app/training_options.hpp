#pragma once
// The command line of a training program, as the examples use it, ready for user programs: epochs, batch
// size, data, threads, device, checkpoints, and the distributed choices (consistency, placement, learning
// rate scaling). Parsing (CLI11) takes --flag value and --flag=value, checks ranges and names, answers a
// mistake with one line naming the flag (exit status 2) and --help with the usage (exit status 0).
//
//   auto options = app::parse_training_options(argc, argv, "Trains my model.", {.epochs = 10});
//   auto cluster = cluster::Cluster::from_environment();
//   auto strategy = train::strategy_for(cluster, app::distributed_options(options));
//   auto schedule = app::scaled_for_workers(optim::constant(options.learning_rate), cluster.spec().replicas(),
//                                           app::steps_per_epoch(train_set.size(), cluster.spec().replicas(), options), options);

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "cohort/core/device.hpp"
#include "cohort/data/transforms.hpp"
#include "cohort/nn/precision.hpp"
#include "cohort/nn/zoo.hpp"
#include "cohort/optim/schedule.hpp"
#include "cohort/train/parameter_server.hpp"
#include "cohort/train/strategy.hpp"
#include "cohort/train/trainer.hpp"

namespace cohort::app {

struct TrainingOptions {
  std::int64_t epochs = 5;
  std::int64_t batch_size = 64;
  std::int64_t accumulate_steps = 1;  // backward passes per update
  std::int64_t max_steps = 0;      // 0: no limit
  std::int64_t train_samples = 0;  // 0: the whole training set
  std::string data_dir;
  int threads = 0;  // 0: all cores
  std::string device = "auto";
  std::string precision = "float32";  // nn/precision.hpp: float32, mixed_bfloat16 or mixed_float16
  bool resident_images = false;       // on a device, the training set's 8-bit images kept there (FitOptions)
  bool capture_steps = true;          // on a device, full batches' steps captured and replayed (FitOptions)
  double learning_rate = 1e-3;
  std::uint64_t seed = 1;
  bool summary_only = false;
  bool demo = false;
  std::string checkpoint_dir;
  std::int64_t checkpoint_every = 0;
  bool resume = false;
  std::string history_csv;
  std::string save_model;  // a model file for inference (nn::save_model), written by the chief at the end
  std::string timeline;    // a Chrome trace of the run (FitOptions::timeline)
  std::string tensorboard;  // a TensorBoard log directory (train::TensorBoard, the chief's curves)
  std::int64_t tensorboard_every = 0;  // and batch scalars every N steps
  std::string report;  // an HTML page about the run (train::RunReport), written by the chief
  // Distributed runs (under cohort-launch or any cluster environment)
  std::string consistency = "sync";
  std::string placement = "size-balanced";
  std::int64_t max_shard_bytes = 0;
  bool each_worker_full_pass = false;
  bool sync_batch_norm = false;  // batch normalization over every replica's batch (nn::SyncBatchNormalization)
  std::string lr_scaling = "sqrt";
  std::string gradient_dtype = "float32";  // float32 or bfloat16: what gradients travel as
  std::string shard_optimizer = "none";    // none, zero1 or zero2 (RingAllreduceOptions::zero_stage)
  std::string gradient_codec = "none";     // none, powersgd or powersgd:R (RingAllreduceOptions::codec)
  std::string verbosity = "auto";
};

// Parses argv over `defaults`; on --help or a mistake prints and exits.
TrainingOptions parse_training_options(int argc, const char* const* argv, std::string_view purpose,
                                       TrainingOptions defaults = {});
// A misspelled COHORT_* setting, or one this build and processor cannot follow, ends the program with one
// line and status 2, before it loads data or connects, as a bad option does (parse_training_options calls it).
void check_settings_or_exit();

train::ParameterServerOptions distributed_options(const TrainingOptions& options);
// fit()'s options from the command line (epochs, steps, batch, accumulation, seed, verbosity, checkpoints);
// the data's transforms and validation set are the program's.
train::FitOptions fit_options(const TrainingOptions& options);
// Where this process trains: --device for workers, logged with the reason when "auto" falls back to
// the CPU; parameter servers keep their variables on the CPU.
Device training_device(const TrainingOptions& options, train::Strategy& strategy);
// The model's precision policy (--precision).
nn::Precision precision(const TrainingOptions& options);
// Where the zoo models' batch normalization takes its statistics from (--sync-batch-norm).
inline nn::BatchStatistics batch_statistics(const TrainingOptions& options) {
  return options.sync_batch_norm ? nn::BatchStatistics::Global : nn::BatchStatistics::PerReplica;
}
// Optimizer steps in one epoch: the global batch is the workers' batches together (each accumulated over
// --accumulate-steps passes), unless every worker reads the whole set.
std::int64_t steps_per_epoch(std::int64_t samples, int replicas, const TrainingOptions& options);
// The learning rate scaled with the number of workers (--lr-scaling), warmed up over the first epoch
// (Goyal et al. 2017).
optim::Schedule scaled_for_workers(optim::Schedule base, int replicas, std::int64_t steps_per_epoch,
                                   const TrainingOptions& options);
// FitOptions::verbosity from --verbosity (auto, lines, epochs, silent).
train::Verbosity verbosity(const TrainingOptions& options);
// The Fashion-MNIST directory the examples read (--data-dir, else Debian's); DataError with the system's
// reason and how to get the data when it does not hold the four files.
std::filesystem::path fashion_mnist_directory(const std::string& data_dir);
// The chief's files at the end of a run: --history-csv, and --save-model with the input normalization the
// model was trained behind (said on stdout).
void write_run_outputs(const TrainingOptions& options, const train::History& history, const nn::Sequential& model,
                       const data::ChannelStatistics& input);

}  // namespace cohort::app
