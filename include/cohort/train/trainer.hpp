#pragma once
// Trainer: fit(), evaluate() and predict() for a Sequential model, Keras-style. The loss and metrics are
// options (Keras' compile()): categorical cross-entropy and accuracy by default; the loss is checked
// against the model's last layer and the data before training starts. The same Trainer runs
// single-process (train::Local) or distributed: the Strategy decides the rest. Epoch metrics, training
// and validation, are averaged over all processes that train, weighted by samples, so that every
// process's History (a parameter server's too) holds the same numbers.
// Training runs on the model's device: the optimizer's state is moved there, and each batch is copied
// there from pinned host memory on a CopyStream while the previous step computes. predict() takes
// samples on any device and returns its outputs on the host.
//
//   nn::Sequential model({28, 28, 1});  ...
//   Trainer trainer(model, optim::Adam(), std::make_shared<train::Local>(),
//                   {.loss = nn::SparseCategoricalCrossentropy{.from_logits = true}, .metrics = {"accuracy"}});
//   auto history = trainer.fit(train_set, {.epochs = 5, .batch_size = 64, .validation = &test_set});
//   fmt::print("test accuracy {:.4f}\n", trainer.evaluate(test_set).at("accuracy"));

#include <chrono>
#include <concepts>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "cohort/data/dataset.hpp"
#include "cohort/data/image_augmentation.hpp"
#include "cohort/data/transforms.hpp"
#include "cohort/nn/loss.hpp"
#include "cohort/nn/metric.hpp"
#include "cohort/nn/sequential.hpp"
#include "cohort/optim/optimizer.hpp"
#include "cohort/tensor/allocator.hpp"
#include "cohort/tensor/running_sums.hpp"
#include "cohort/train/callbacks.hpp"
#include "cohort/train/checkpoint.hpp"
#include "cohort/train/history.hpp"
#include "cohort/train/progress.hpp"
#include "cohort/train/gradient_accumulator.hpp"
#include "cohort/train/strategy.hpp"

namespace cohort::train {

class StepCapture;  // train/step_capture.hpp

// Auto: a live bar on a terminal, log lines otherwise; Lines: log lines; Epochs: one line per epoch.
enum class Verbosity { Silent, Auto, Lines, Epochs };

struct FitOptions {
  std::int64_t epochs = 1;
  std::int64_t max_steps = 0;  // > 0: stop after this many optimizer steps in total
  std::int64_t batch_size = 32;
  // Gradient accumulation (Horovod's backward_passes_per_step): accumulate_steps forward/backward passes
  // at batch_size, then one update that equals one step at accumulate_steps x batch_size; an epoch's last
  // update takes the passes that are left. Steps (max_steps, checkpoint_every_steps, callbacks' batches)
  // count updates. Each pass normalizes a BatchNormalization layer with its own batch's statistics and
  // moves the moving averages once, as k steps at batch_size would; dropout draws a mask per pass.
  std::int64_t accumulate_steps = 1;
  bool shuffle = true;
  std::uint64_t seed = 0;  // data order and augmentation
  std::vector<data::Transform> transforms;
  // The images' augmentation and normalization as a description (instead of `transforms`): on a device the
  // loader copies the data set's 8-bit images and the device expands them (a quarter of float32's bytes to
  // copy, and no per-sample work on the host); on the CPU it runs as the same transforms on the loader's
  // thread. The same values either way. Takes a data set of 8-bit images (ImageDataset).
  std::optional<data::ImageAugmentation> augmentation;
  // With an augmentation on a device: the training set's 8-bit images are copied there once, at the start
  // (CIFAR-10's take 147 MiB), and each batch brings only its samples' indices, labels and draws.
  bool resident_images = false;
  const data::Dataset* validation = nullptr;
  std::vector<std::shared_ptr<Callback>> callbacks;
  Verbosity verbosity = Verbosity::Auto;
  // Checkpoints go to checkpoint_dir at the end of every epoch and, when checkpoint_every_steps > 0, every
  // that many steps (latest.ckpt, or the parameter servers' snapshots and ps.manifest); resume continues
  // from the latest one when present, as does a job that cohort-launch --restarts started again.
  std::filesystem::path checkpoint_dir;
  std::int64_t checkpoint_every_steps = 0;
  bool resume = false;
  // A Chrome trace of the run (chrome://tracing, Perfetto): data waits, each layer's forward and backward,
  // the loss, each collective and parameter-server exchange, the updates, on a track per thread. In a
  // distributed job each process writes <stem>.<process><extension> beside it (trace.chief-0.json); under
  // cohort-launch the launcher merges them into this file, a track per process.
  std::filesystem::path timeline;
  // On a GPU (and the emulated device), the training step of a full batch is captured once and replayed for
  // each batch of the same shape (a CUDA graph: one launch per step instead of one per op), from the second
  // such step of an epoch on; the validation's full batches likewise. Steps that cannot be captured run op by
  // op: several processes, gradient accumulation, mixed_float16's loss scale, a partial batch, or a layer that
  // reads values back (which the log names once). False runs every step op by op.
  bool capture_steps = true;
};

struct TrainerOptions {
  nn::Loss loss = nn::CategoricalCrossentropy{};
  // Reported beside the loss, in this order; empty: accuracy for the classification losses.
  std::vector<nn::Metric> metrics;
  // On a GPU (and the emulated device), evaluate() replays the recorded evaluation of a full batch for the next
  // ones of that shape, as fit() replays its steps (FitOptions::capture_steps, which also rules fit()'s
  // validation). False evaluates every batch op by op.
  bool capture_evaluation = true;
};

class Trainer {
 public:
  template <std::derived_from<optim::Optimizer> O>
  Trainer(nn::Sequential& model, O optimizer, std::shared_ptr<Strategy> strategy = std::make_shared<Local>(),
          TrainerOptions options = {})
      : Trainer(model, std::unique_ptr<optim::Optimizer>(new O(std::move(optimizer))), std::move(strategy),
                std::move(options)) {}
  Trainer(nn::Sequential& model, std::unique_ptr<optim::Optimizer> optimizer,
          std::shared_ptr<Strategy> strategy = std::make_shared<Local>(), TrainerOptions options = {});
  ~Trainer();
  Trainer(Trainer&&) noexcept;

  // Trains; in a process that serves instead (a parameter server), serve() with the options' checkpoint
  // directory, resume and timeline.
  History fit(const data::Dataset& train, const FitOptions& options);
  // Serves the run from its start to its end, in a process whose strategy gives it a service (a parameter
  // server); returns the run's history, which the chief sends at the end.
  History serve(const ServeOptions& options);
  // The loss and the metrics over a whole data set, in inference mode, on this process.
  Logs evaluate(const data::Dataset& dataset, std::int64_t batch_size = 256);
  // Model outputs (N, classes) for a batch of samples, in inference mode.
  Tensor predict(const Tensor& images, std::int64_t batch_size = 256);

  optim::Optimizer& optimizer() { return *optimizer_; }
  nn::Sequential& model() { return model_; }
  Strategy& strategy() { return *strategy_; }
  const nn::Loss& loss() const { return loss_; }
  const std::vector<nn::Metric>& metrics() const { return metrics_; }

 private:
  // Over an epoch's batches, or an evaluation's: the samples, counted on the host, and the loss and each
  // metric summed over them on the model's device, read only when they are shown or reported.
  struct Totals {
    double samples = 0;
    RunningSums sums;  // slot 0 the loss, then the metrics in order
  };
  Totals new_totals() const;
  // The samples, then the sums: read from the device, which waits for it.
  static std::vector<double> read(const Totals& totals);
  // The loss and metrics as means over the samples, from read()'s values.
  Logs logs_of(const std::vector<double>& values, const std::string& prefix) const;
  // The values the progress bar shows, loss first, then the metrics in the order given.
  OrderedLogs shown(const Logs& logs, bool with_validation) const;
  // A batch's outputs, without the final activation when the loss fuses it, and whether they are logits.
  struct Scored {
    Tensor prediction;
    bool logits = false;
  };
  Scored score(const Tensor& images, bool inference_only);
  // Adds a scored batch's loss and metrics to `totals`; writes dL/dprediction into `gradient` when it is defined.
  void add_to(Totals& totals, const Scored& scored, const Tensor& targets, const Tensor& gradient = Tensor()) const;
  // Refuses a layer that sums over the replicas under a strategy that cannot sum them.
  void check_replica_sum() const;
  // Checks that the loss and metrics fit the model and `dataset`.
  void check_fits(const data::Dataset& dataset) const;
  // What follows "the ... loss became nan": under mixed_float16 that activations overflowed float16.
  std::string non_finite_advice() const;
  // Totals over this process's share of `dataset`.
  // `capture`: full batches after the first replay the recorded evaluation of one, on a device that records.
  Totals evaluate_share(const data::Dataset& dataset, std::int64_t batch_size, int replica, int replicas, bool capture);
  // fit() itself; fit() tells the other processes why when it throws. Its steps follow, in order.
  History run(const data::Dataset& train, const FitOptions& options);
  struct FitState;  // what one fit() carries from step to step
  void check_fit_arguments(const data::Dataset& train, const FitOptions& options) const;
  void make_checkpoint_directory(const FitState& fit) const;
  // Restores the latest checkpoint where asked to (or restarted by cohort-launch).
  void resume(FitState& fit);
  // mixed_float16's loss scale, from the checkpoint where it holds one.
  void start_precision(const FitState& fit);
  // Every replica trains in the same precision, from the same variables.
  void agree_on_start();
  // What the chief says before training: the precision, the strategy's plan, a run that has finished.
  void report_setup(const FitState& fit) const;
  // The data loader of this process's share, and the epochs and steps to come.
  void plan_epochs(FitState& fit);
  void start_callbacks(FitState& fit);
  // One epoch: its updates, the logs agreed over the processes, the callbacks and a checkpoint; false when
  // the processes agreed to stop before it began.
  bool train_epoch(FitState& fit, std::int64_t epoch);
  // Bytes of the model's device (not the CPU): the most in use during a step, in use now, and reserved by its
  // caching allocator (in use and cached).
  struct DeviceMemory {
    std::size_t step_peak = 0, in_use = 0, reserved = 0;
  };
  struct EpochTotals {
    Totals training;
    std::chrono::steady_clock::time_point started;
    double data_seconds = 0;           // waiting for the input pipeline
    double mean_training_seconds = 0;  // this process's, then the mean over the processes
    std::optional<DeviceMemory> device_memory = std::nullopt;
    // The steps whose losses were added since the last read (first -1: none), for an error to name them.
    std::int64_t first_unread_step = -1, last_unread_step = -1;
  };
  EpochTotals train_batches(FitState& fit, std::int64_t epoch, ProgressBar& progress);
  // One forward/backward pass on a batch, its loss and metrics added to the epoch's; when `completes_update`,
  // then the update over the samples of the passes accumulated since the last one and this one. With
  // `check_loss`, the loss is read before the backward pass, so that one that is not finite stops the step.
  void train_step(const Tensor& images, const Tensor& targets, bool completes_update, EpochTotals& epoch_totals,
                  bool check_loss);
  // train_step(), or the replay of a captured one where it may (FitOptions::capture_steps).
  void run_step(FitState& fit, const Tensor& images, const Tensor& targets, bool completes_update,
                EpochTotals& epoch_totals);
  // Whether every step of this fit() may be captured: a device that records, one process, an update that is
  // ops on the device alone.
  bool steps_capturable(const FitState& fit) const;
  // The epoch's training totals so far (read()); Error when the loss stopped being finite since the last read.
  std::vector<double> read_training_totals(EpochTotals& epoch_totals) const;
  // Whether a callback reads the loss and metrics in on_batch_end after `step`.
  static bool callbacks_read_batch_logs(const FitState& fit, std::int64_t step);
  // Takes a step's device memory into the epoch's figures and the timeline.
  static void note_device_memory(const Allocator& allocator, EpochTotals& epoch_totals);
  // After each update: callbacks, agreement, checkpoints, limits; false when the epoch ends here.
  bool after_update(FitState& fit, std::int64_t epoch, const Logs& logs);
  // The epoch's logs over every process, validation included.
  Logs epoch_logs(FitState& fit, std::int64_t epoch, EpochTotals& totals);
  void save(FitState& fit);
  // The history, the strategy's final report and the callbacks' end.
  History finish_run(FitState& fit);
  // Agrees on the callbacks' requests among the processes and applies what was agreed; the chief logs
  // which processes asked for what, `moment` ("after epoch 2") saying when.
  void agree(TrainingControl& control, std::string_view moment);
  void report_requests(const std::vector<double>& votes, std::string_view moment) const;
  // Where the processes do not agree (backup workers), says what becomes of this process's requests.
  void warn_unagreed(const std::vector<double>& votes, std::string_view moment) const;
  // What TrainingControl::require_on_every_process asked for is the same on every process that trains.
  void check_required_everywhere(const TrainingControl& control);
  // The agreement's votes: stop, rate requests, their sum, the rate factor and its square; then which
  // replicas asked to stop, and which for a rate.
  static constexpr std::size_t kVotes = 5;
  // Unless COHORT_GEMM names a path: the GEMM path a resumed run used before, else the chief's, for every
  // process that trains, so that runs repeat bit for bit; unless COHORT_CPU_ISA names one, the convolution
  // kernels' instruction set the resumed run used. Both are recorded in `position` for the checkpoints.
  void agree_on_cpu_kernels(TrainingPosition& position);

  nn::Sequential& model_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::optional<LossScale> loss_scale_;  // mixed_float16 only
  std::shared_ptr<Strategy> strategy_;
  nn::Loss loss_;
  std::vector<nn::Metric> metrics_;
  Tensor output_gradient_;
  GradientAccumulator accumulator_;
  std::int64_t accumulated_samples_ = 0;  // in the passes since the last update
  bool capture_evaluation_;
  bool evaluation_not_captured_ = false;  // a recording failed: the log said why, once
  std::unique_ptr<StepCapture> captured_;
};

}  // namespace cohort::train

namespace cohort {
using train::Trainer;
}  // namespace cohort
