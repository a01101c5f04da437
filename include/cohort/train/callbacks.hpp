#pragma once
// Callbacks observe fit() (Keras-style hooks) and may stop it or change the learning rate. They are
// safe in distributed runs: a request made on any process is agreed among all processes that train
// before it takes effect, at the same step everywhere. Agreement happens at the end of every step
// (when any process's fit() has callbacks and the strategy steps in lockstep; with asynchronous or
// bounded-staleness parameter servers only at epoch boundaries, and a request made mid-epoch is warned about
// as waiting for its end) and after on_epoch_begin and on_epoch_end: a stop ends every process
// after that step or epoch, with status 0; a learning-rate change (the mean of the rates asked for, when
// processes ask for different ones) applies from the next step on every process and parameter server.
// Change the rate through the control, not the optimizer, so that it is agreed.
// Epoch logs hold metrics over all processes (the same numbers everywhere); batch logs are this
// process's share of the epoch so far (loss, metrics, samples_per_second, learning_rate); the loss and
// metrics are there, on every device alike, at least at the steps where some callback's needs_batch_logs()
// says it reads them (by default: every step, for a callback that overrides on_batch_end). With backup
// workers (ps::Sync::backup_workers), whose processes never wait for each other, nothing is agreed: each
// process acts on its own stop, at the end of the epoch, and metrics (its validation over the whole
// validation set), and warns that it does; the chief's stop still ends the run for every process, and the
// servers update with the chief's learning rate (another worker's request is warned as having no effect).
// The chief logs every agreed request with the processes that made it.
//
//   struct StopAtLoss : train::Callback {
//     void on_epoch_end(std::int64_t, const train::Logs& logs, train::TrainingControl& c) override {
//       if (logs.at("loss") < 0.1) c.stop();
//     }
//   };

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cohort/nn/sequential.hpp"
#include "cohort/optim/optimizer.hpp"
#include "cohort/train/logs.hpp"

namespace cohort::train {

class Trainer;

class TrainingControl {
 public:
  TrainingControl(Trainer& trainer, bool chief) : trainer_(trainer), chief_(chief) {}

  // Ends training at the next agreement point.
  void stop() { stop_requested_ = true; }
  // Sets the optimizer's learning rate: on this process at once (the callbacks that follow see it), on
  // every process at the next agreement point, which may settle on another (the mean of all requests).
  void set_learning_rate(double learning_rate);

  // What this process asked for since the last agreement.
  bool stop_requested() const { return stop_requested_; }
  std::optional<double> requested_learning_rate() const { return requested_learning_rate_; }

  Trainer& trainer() { return trainer_; }
  nn::Sequential& model();
  optim::Optimizer& optimizer();
  // The chief writes files (checkpoints, logs); every process runs the callbacks.
  bool is_chief() const { return chief_; }

  // True once the processes agreed to stop.
  bool stopping() const { return stopping_; }
  // In on_train_begin: `what` (a callback that changes the variables itself) must run on every process
  // that trains, or the replicas would part; fit() fails naming it when some process lacks it.
  void require_on_every_process(const std::string& what);
  const std::vector<std::string>& required_on_every_process() const { return required_everywhere_; }
  // Whether the variables live on parameter servers, which a callback cannot write.
  bool variables_on_servers() const;

  // For the trainer, before agreeing: puts back the rate factor this process had before its own request,
  // so that every process votes from the same state.
  void withdraw_local_rate();
  // For the trainer, after agreeing: whether to stop; the requests are spent.
  void set_agreed(bool stop);

 private:
  Trainer& trainer_;
  bool chief_;
  bool stop_requested_ = false;
  bool stopping_ = false;
  std::optional<double> requested_learning_rate_;
  std::optional<double> factor_before_request_;
  std::vector<std::string> required_everywhere_;
};

class Callback {
 public:
  virtual ~Callback() = default;
  virtual void on_train_begin(TrainingControl&) {}
  virtual void on_epoch_begin(std::int64_t /*epoch*/, TrainingControl&) {}
  // `step` counts optimizer steps since the start of training (resumed runs continue the count): the
  // steps taken before this batch, and including it at its end.
  virtual void on_batch_begin(std::int64_t /*step*/, TrainingControl&) {}
  virtual void on_batch_end(std::int64_t /*step*/, const Logs& /*logs*/, TrainingControl&) { overrides_batch_end_ = false; }
  virtual void on_epoch_end(std::int64_t /*epoch*/, const Logs& /*logs*/, TrainingControl&) {}
  virtual void on_train_end(const Logs& /*logs*/) {}

  // Whether on_batch_end after `step` reads the loss or the metrics from its logs. On a device they are
  // summed there and reading them makes the host wait for it, so fit() reads them only at the steps where
  // a callback needs them (and where the progress bar redraws); at the others the logs hold the learning
  // rate and samples_per_second alone. By default: at every step when the callback overrides on_batch_end
  // (one that also calls Callback::on_batch_end must override this too).
  virtual bool needs_batch_logs(std::int64_t /*step*/) const { return overrides_batch_end_; }

 private:
  bool overrides_batch_end_ = true;  // until the base on_batch_end runs
};

// A callback from plain functions, for the hooks one needs.
struct LambdaCallback : Callback {
  std::function<void(TrainingControl&)> train_begin;
  std::function<void(std::int64_t, TrainingControl&)> epoch_begin, batch_begin;
  std::function<void(std::int64_t, const Logs&, TrainingControl&)> batch_end, epoch_end;
  std::function<void(const Logs&)> train_end;

  void on_train_begin(TrainingControl& control) override;
  void on_epoch_begin(std::int64_t epoch, TrainingControl& control) override;
  void on_batch_begin(std::int64_t step, TrainingControl& control) override;
  void on_batch_end(std::int64_t step, const Logs& logs, TrainingControl& control) override;
  void on_epoch_end(std::int64_t epoch, const Logs& logs, TrainingControl& control) override;
  void on_train_end(const Logs& logs) override;
  bool needs_batch_logs(std::int64_t) const override { return static_cast<bool>(batch_end); }
};

// Whether a smaller or a larger value of the monitored metric is better; Auto: larger for names with
// "acc" in them, smaller otherwise (Keras).
enum class Mode { Auto, Min, Max };

// The best value so far of the log a built-in callback monitors.
class BestSoFar {
 public:
  BestSoFar(std::string monitor, Mode mode, std::string owner);
  // Reads the monitored value (an InvalidArgument naming what the logs hold when they lack it) and keeps
  // it when it is the first or beats the best by more than min_delta; returns whether it did.
  bool improves(const Logs& logs, double min_delta);
  double best() const { return best_.value_or(0.0); }
  void reset() { best_.reset(); }

 private:
  std::string monitor_, owner_;
  bool larger_is_better_;
  std::optional<double> best_;
};

// Stops when `monitor` has not improved by more than min_delta for `patience` epochs in a row (Keras).
struct EarlyStoppingOptions {
  std::string monitor = "val_loss";
  double min_delta = 0;
  std::int64_t patience = 0;
  Mode mode = Mode::Auto;
  // Puts back the variables of the best epoch when it stops training. In a distributed run every process
  // that trains must run it (fit() fails naming it otherwise); over parameter servers it is refused, since
  // the servers hold the variables.
  bool restore_best_weights = false;
};

class EarlyStopping : public Callback {
 public:
  explicit EarlyStopping(EarlyStoppingOptions options = {});
  void on_train_begin(TrainingControl& control) override;
  void on_epoch_end(std::int64_t epoch, const Logs& logs, TrainingControl& control) override;
  bool needs_batch_logs(std::int64_t) const override { return false; }  // acts on epochs only
  // The epoch after which training stopped, when it did, counted from 1 as the log and History count it
  // (the hooks' `epoch` arguments are indices from 0).
  std::optional<std::int64_t> stopped_epoch() const { return stopped_epoch_; }

 private:
  void restore_best(TrainingControl& control);

  EarlyStoppingOptions options_;
  BestSoFar best_;
  std::int64_t waited_ = 0;
  std::optional<std::int64_t> stopped_epoch_;
  std::vector<Tensor> best_values_;
  std::int64_t best_epoch_ = 0;  // 1-based, of best_values_
};

// Multiplies the learning rate by `factor` when `monitor` has not improved for `patience` epochs, then
// waits `cooldown` epochs; never below min_learning_rate.
struct ReduceLROnPlateauOptions {
  std::string monitor = "val_loss";
  double factor = 0.1;
  std::int64_t patience = 10;
  Mode mode = Mode::Auto;
  double min_delta = 1e-4;
  std::int64_t cooldown = 0;
  double min_learning_rate = 0;
};

class ReduceLROnPlateau : public Callback {
 public:
  explicit ReduceLROnPlateau(ReduceLROnPlateauOptions options = {});
  void on_epoch_end(std::int64_t epoch, const Logs& logs, TrainingControl& control) override;
  bool needs_batch_logs(std::int64_t) const override { return false; }  // acts on epochs only

 private:
  ReduceLROnPlateauOptions options_;
  BestSoFar best_;
  std::int64_t waited_ = 0, cooling_ = 0;
};

// Saves the model's weights (nn::save_weights) on the chief after epochs: every epoch, or only when
// `monitor` improved (best_only); keeps the newest keep_last files (0: all). `path` may hold "{epoch}"
// (1-based) and the name of any log, e.g. "ckpt/weights-{epoch:03d}-{val_loss:.4f}.weights" (fmt syntax).
struct ModelCheckpointOptions {
  std::filesystem::path path;
  std::string monitor = "val_loss";
  Mode mode = Mode::Auto;
  bool best_only = false;
  std::int64_t keep_last = 0;
};

class ModelCheckpoint : public Callback {
 public:
  explicit ModelCheckpoint(ModelCheckpointOptions options);
  void on_epoch_end(std::int64_t epoch, const Logs& logs, TrainingControl& control) override;
  bool needs_batch_logs(std::int64_t) const override { return false; }  // acts on epochs only
  // Files written and still kept, oldest first.
  const std::vector<std::filesystem::path>& kept() const { return kept_; }

 private:
  ModelCheckpointOptions options_;
  BestSoFar best_;
  std::vector<std::filesystem::path> kept_;
};

// Appends one CSV row per epoch on the chief (header first), flushed at once, so that a crashed run
// keeps its rows; append = true continues an existing file.
class CSVLogger : public Callback {
 public:
  explicit CSVLogger(std::filesystem::path path, bool append = false);
  void on_train_begin(TrainingControl& control) override;
  void on_epoch_end(std::int64_t epoch, const Logs& logs, TrainingControl& control) override;
  bool needs_batch_logs(std::int64_t) const override { return false; }  // acts on epochs only

 private:
  std::filesystem::path path_;
  bool append_;
  std::vector<std::string> columns_;
};

}  // namespace cohort::train
