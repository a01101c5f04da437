#include "cohort/train/trainer.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <optional>

#include "cohort/core/check.hpp"
#include "cohort/core/logging.hpp"
#include "cohort/data/loader.hpp"
#include "cohort/nn/loss.hpp"
#include "cohort/tensor/copy_stream.hpp"
#include "cohort/tensor/ops.hpp"
#include "cohort/train/progress.hpp"

namespace cohort::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// cohort-launch --restarts sets COHORT_RESTART to the restart's number: continue from the latest checkpoint.
bool restarted_by_launcher() {
  const char* restart = std::getenv("COHORT_RESTART");
  return restart != nullptr && *restart != '\0' && std::string_view(restart) != "0";
}

// Restores the model's train/eval mode when it goes out of scope.
class ModeGuard {
 public:
  explicit ModeGuard(nn::Sequential& model) : model_(model), was_training_(model.is_training()) {}
  ~ModeGuard() { was_training_ ? model_.train() : model_.eval(); }
  ModeGuard(const ModeGuard&) = delete;
  ModeGuard& operator=(const ModeGuard&) = delete;

 private:
  nn::Sequential& model_;
  bool was_training_;
};

void check_compatible(const nn::Sequential& model, const data::Dataset& dataset) {
  COHORT_CHECK(dataset.sample_shape() == model.input_shape(), "data set '{}' has samples of shape {}, the model takes {}",
               dataset.description(), dataset.sample_shape(), model.input_shape());
  const Shape& out = model.output_shape();
  COHORT_CHECK(out.rank() == 1 && out[0] == dataset.num_classes(),
               "the model outputs {} per sample, the data set '{}' has {} classes", out, dataset.description(),
               dataset.num_classes());
}

// Batches on the model's device. On the CPU they are the loader's own; elsewhere each batch is copied on
// a CopyStream into one of two device buffers, so that the copy of batch k + 1 overlaps step k.
class DeviceBatches {
 public:
  DeviceBatches(data::DataLoader::Epoch& source, Device device) : source_(source), device_(device) {
    if (device_ != Device::CPU) stream_.emplace(device_);
    pending_ = stage(source_.next());
  }

  std::optional<data::Batch> next() {
    std::optional<data::Batch> ready = std::move(pending_);
    pending_.reset();
    if (!ready) return std::nullopt;
    if (stream_) stream_->synchronize();
    pending_ = stage(source_.next());
    return ready;
  }

 private:
  std::optional<data::Batch> stage(std::optional<data::Batch> host) {
    if (!host || !stream_) return host;
    Slot& slot = slots_[next_slot_];
    next_slot_ = 1 - next_slot_;
    data::Batch on_device{reuse(slot.images, host->images), reuse(slot.labels, host->labels), host->index};
    stream_->copy(host->images, on_device.images);
    stream_->copy(host->labels, on_device.labels);
    return on_device;
  }

  // A device buffer for `like`, kept while the batch shape stays the same.
  Tensor reuse(Tensor& buffer, const Tensor& like) const {
    if (!buffer.defined() || buffer.shape() != like.shape()) buffer = Tensor::uninitialized(like.shape(), device_);
    return buffer;
  }

  // Two slots, so that a batch is copied into one while the other is in use.
  struct Slot {
    Tensor images, labels;
  };

  data::DataLoader::Epoch& source_;
  Device device_;
  std::optional<CopyStream> stream_;
  Slot slots_[2];
  int next_slot_ = 0;
  std::optional<data::Batch> pending_;
};

}  // namespace

Trainer::Trainer(nn::Sequential& model, std::unique_ptr<optim::Optimizer> optimizer, std::shared_ptr<Strategy> strategy)
    : model_(model), optimizer_(std::move(optimizer)), strategy_(std::move(strategy)) {
  COHORT_CHECK(optimizer_ != nullptr && strategy_ != nullptr, "Trainer needs an optimizer and a strategy");
}

std::pair<double, std::int64_t> Trainer::train_step(const Tensor& images, const Tensor& labels) {
  if (images.dim(0) == 0) {
    // This replica's share of the epoch's last step is empty: it contributes zero gradients.
    for (const auto& v : model_.trainable_variables()) ops::fill(v->gradient, 0.0f);
    strategy_->apply_gradients(model_, *optimizer_, 0);
    return {0.0, 0};
  }
  const bool fused = model_.ends_with_softmax();
  const Tensor prediction = fused ? model_.forward_logits(images) : model_.forward(images);
  if (!output_gradient_.defined() || output_gradient_.shape() != prediction.shape() ||
      output_gradient_.device() != prediction.device())
    output_gradient_ = Tensor(prediction.shape(), prediction.device());
  const double loss = nn::CategoricalCrossentropy{.from_logits = fused}.compute(prediction, labels, output_gradient_);
  if (!std::isfinite(loss))
    throw Error(fmt::format("the training loss became {} at step {} (learning rate {:.3g}); lower the learning rate",
                            loss, optimizer_->iterations(), optimizer_->learning_rate()));
  const std::int64_t correct = ops::count_correct(prediction, labels);
  model_.backward(output_gradient_);
  strategy_->apply_gradients(model_, *optimizer_, images.dim(0));
  return {loss, correct};
}

History Trainer::fit(const data::Dataset& train, const FitOptions& options) {
  COHORT_CHECK(options.epochs > 0 || options.max_steps > 0, "fit() needs epochs > 0 or max_steps > 0");
  COHORT_CHECK(train.size() > 0, "fit() got an empty training set '{}'", train.description());
  check_compatible(model_, train);
  if (options.validation != nullptr) check_compatible(model_, *options.validation);
  const bool chief = strategy_->is_chief();
  const bool verbose = chief && options.verbosity != Verbosity::Silent;
  const std::filesystem::path& checkpoint_dir = options.checkpoint_dir;

  TrainingPosition position{.data_seed = options.seed};
  if ((options.resume || restarted_by_launcher()) && !checkpoint_dir.empty()) {
    if (auto restored = strategy_->restore_checkpoint(checkpoint_dir, model_, *optimizer_)) {
      position = std::move(*restored);
      if (verbose)
        log::info("resumed from {}: epoch {}, batch {}, step {}", checkpoint_dir.string(), position.epoch + 1,
                  position.batch_in_epoch, position.global_step);
    }
  }
  optimizer_->to(model_.device());
  strategy_->initialize(model_, *optimizer_);  // after a resume, so that all processes start from the chief's
  if (strategy_->is_server()) {
    strategy_->serve(model_, *optimizer_, checkpoint_dir);
    return position.history;
  }
  if (verbose) {
    const std::string setup = strategy_->setup_report();
    if (!setup.empty()) fmt::print("{}", setup);
  }
  const std::int64_t epochs = options.epochs > 0 ? options.epochs : std::numeric_limits<std::int64_t>::max();

  const DataShare share = strategy_->data_share();
  data::LoaderOptions loader_options{.batch_size = options.batch_size,
                                     .shuffle = options.shuffle,
                                     .seed = position.data_seed + share.seed_offset,
                                     .transforms = options.transforms,
                                     .replica = share.replica,
                                     .replicas = share.replicas,
                                     .pinned = model_.device() != Device::CPU};
  const data::DataLoader loader(train, loader_options,
                                strategy_->sampler(train.size(), loader_options.seed, options.shuffle));
  // With EachWorkerFullPass every replica reads the whole set: an epoch then means replicas passes.
  const bool every_replica_reads_all = share.replicas == 1 && strategy_->replicas() > 1;
  if (verbose)
    log::info("training on {} with strategy '{}': {} samples per epoch{}, global batch {} = {} replica(s) x {}, {} steps "
              "per epoch",
              train.description(), strategy_->name(),
              loader.samples_per_epoch() * (every_replica_reads_all ? strategy_->replicas() : 1),
              every_replica_reads_all ? " (every replica reads the whole set)" : "",
              options.batch_size * strategy_->replicas(), strategy_->replicas(), options.batch_size,
              loader.batches_per_epoch());

  auto save = [&] {
    if (checkpoint_dir.empty()) return;
    strategy_->save_checkpoint(checkpoint_dir, model_, *optimizer_, position);
    if (verbose) log::info("checkpoint of step {} saved to {}", position.global_step, checkpoint_dir.string());
  };

  TrainingControl control;
  for (auto& callback : options.callbacks) callback->on_train_begin(control);
  ModeGuard mode(model_);
  Logs last_logs;
  std::optional<Logs> partial_epoch;
  bool step_limit_reached = false;
  for (std::int64_t epoch = position.epoch; epoch < epochs && !control.stop_requested() && !step_limit_reached; ++epoch) {
    for (auto& callback : options.callbacks) callback->on_epoch_begin(epoch, control);
    if (verbose && options.epochs > 0) fmt::print("Epoch {}/{}\n", epoch + 1, options.epochs);
    std::fflush(stdout);
    ProgressBar progress(loader.batches_per_epoch(), stdout, options.verbosity == Verbosity::Lines ? 0 : -1);
    const auto epoch_start = Clock::now();
    double loss_sum = 0;
    std::int64_t correct = 0, seen = 0;
    Logs logs;
    auto host_batches = loader.epoch(epoch, position.batch_in_epoch);
    DeviceBatches batches(*host_batches, model_.device());
    while (auto batch = batches.next()) {
      model_.train();
      const auto [loss, batch_correct] = train_step(batch->images, batch->labels);
      const std::int64_t count = batch->labels.numel();
      loss_sum += loss * static_cast<double>(count);
      correct += batch_correct;
      seen += count;
      const double denominator = static_cast<double>(std::max<std::int64_t>(seen, 1));
      ++position.global_step;
      position.batch_in_epoch = batch->index + 1;
      logs = {{"loss", loss_sum / denominator}, {"accuracy", static_cast<double>(correct) / denominator}};
      if (verbose) progress.update(position.batch_in_epoch, logs, static_cast<double>(seen) / seconds_since(epoch_start));
      for (auto& callback : options.callbacks) callback->on_batch_end(position.global_step, logs, control);
      if (options.checkpoint_every_steps > 0 && position.global_step % options.checkpoint_every_steps == 0) save();
      step_limit_reached = options.max_steps > 0 && position.global_step >= options.max_steps;
      if (strategy_->should_stop()) control.stop();
      if (step_limit_reached || control.stop_requested()) break;
    }
    const double seconds = seconds_since(epoch_start);
    logs["seconds"] = seconds;
    logs["images_per_second"] = seen > 0 ? static_cast<double>(seen) / seconds : 0.0;
    logs["learning_rate"] = optimizer_->learning_rate();
    strategy_->add_epoch_logs(logs);
    if (options.validation != nullptr && chief) {
      const Logs validation = evaluate(*options.validation);
      logs["val_loss"] = validation.at("loss");
      logs["val_accuracy"] = validation.at("accuracy");
    }
    if (verbose) {
      Logs shown = logs;
      for (const char* hidden : {"seconds", "images_per_second", "learning_rate"}) shown.erase(hidden);
      progress.finish(shown, seconds, logs["images_per_second"]);
    }
    if (position.batch_in_epoch >= loader.batches_per_epoch()) {
      position.epoch = epoch + 1;
      position.batch_in_epoch = 0;
      position.history.epochs.push_back(logs);
    } else {
      partial_epoch = logs;  // reported, but the checkpoint resumes inside this epoch
    }
    last_logs = logs;
    for (auto& callback : options.callbacks) callback->on_epoch_end(epoch, logs, control);
    save();
  }
  strategy_->finish();
  if (verbose) {
    const std::string report = strategy_->final_report();
    if (!report.empty()) fmt::print("{}", report);
  }
  History result = position.history;
  if (partial_epoch) result.epochs.push_back(*partial_epoch);
  for (auto& callback : options.callbacks) callback->on_train_end(last_logs);
  return result;
}

Logs Trainer::evaluate(const data::Dataset& dataset, std::int64_t batch_size) {
  check_compatible(model_, dataset);
  COHORT_CHECK(dataset.size() > 0, "evaluate() got an empty data set '{}'", dataset.description());
  ModeGuard mode(model_);
  model_.eval();
  const data::DataLoader loader(
      dataset, {.batch_size = batch_size, .shuffle = false, .prefetch = 1, .pinned = model_.device() != Device::CPU});
  const bool fused = model_.ends_with_softmax();
  double loss_sum = 0;
  std::int64_t correct = 0;
  auto host_batches = loader.epoch(0);
  DeviceBatches batches(*host_batches, model_.device());
  while (auto batch = batches.next()) {
    const Tensor prediction = fused ? model_.forward_logits(batch->images) : model_.forward(batch->images);
    loss_sum += nn::CategoricalCrossentropy{.from_logits = fused}.compute(prediction, batch->labels) *
                static_cast<double>(batch->labels.numel());
    correct += ops::count_correct(prediction, batch->labels);
  }
  const auto n = static_cast<double>(dataset.size());
  return {{"loss", loss_sum / n}, {"accuracy", static_cast<double>(correct) / n}};
}

Tensor Trainer::predict(const Tensor& images, std::int64_t batch_size) {
  COHORT_CHECK(batch_size > 0, "batch size must be positive, got {}", batch_size);
  ModeGuard mode(model_);
  model_.eval();
  const std::int64_t n = images.dim(0);
  Tensor outputs(model_.output_shape().batched(n));
  for (std::int64_t begin = 0; begin < n; begin += batch_size) {
    const std::int64_t end = std::min(n, begin + batch_size);
    ops::copy(model_.forward(images.slice(begin, end).to(model_.device())), outputs.slice(begin, end));
  }
  return outputs;
}

}  // namespace cohort::train
