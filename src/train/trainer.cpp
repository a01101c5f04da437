#include "cohort/train/trainer.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <bit>
#include <functional>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <optional>

#include "cohort/core/check.hpp"
#include "cohort/core/format.hpp"
#include "cohort/core/seed.hpp"
#include "cohort/core/settings.hpp"
#include "cohort/tensor/devices.hpp"
#include "cohort/tensor/gemm_path.hpp"
#include "cohort/core/logging.hpp"
#include "cohort/core/timeline.hpp"
#include "cohort/data/loader.hpp"
#include "cohort/nn/loss.hpp"
#include "cohort/tensor/copy_stream.hpp"
#include "cohort/tensor/ops.hpp"
#include "cohort/train/progress.hpp"
#include "process_label.hpp"
#include "train/step_capture.hpp"

namespace cohort::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// cohort-launch --restarts sets COHORT_RESTART to the restart's number: continue from the latest checkpoint.
bool restarted_by_launcher() { return count_setting("COHORT_RESTART", kRestartMeaning).value_or(0) > 0; }

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

// Lends the strategy's sum over the replicas to the model's layers for the length of a fit().
class ReplicaSumBinding {
 public:
  ReplicaSumBinding(nn::Sequential& model, nn::ReplicaSum* sum) : model_(model) { model_.set_replica_sum(sum); }
  ~ReplicaSumBinding() { model_.set_replica_sum(nullptr); }
  ReplicaSumBinding(const ReplicaSumBinding&) = delete;
  ReplicaSumBinding& operator=(const ReplicaSumBinding&) = delete;

 private:
  nn::Sequential& model_;
};

// Whether fit() saves a checkpoint after `step` within an epoch.
bool saves_checkpoint_after(const FitOptions& options, std::int64_t step) {
  return !options.checkpoint_dir.empty() && options.checkpoint_every_steps > 0 && step % options.checkpoint_every_steps == 0;
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
    data::Batch on_device{copied(slot.images, host->images), copied(slot.labels, host->labels), host->index,
                          copied(slot.draws, host->draws), copied(slot.indices, host->indices)};
    return on_device;
  }

  // `host`, when defined, queued for copying into a device buffer kept while the batch shape stays the same.
  Tensor copied(Tensor& buffer, const Tensor& host) {
    if (!host.defined()) return {};
    if (!buffer.defined() || buffer.shape() != host.shape() || buffer.dtype() != host.dtype())
      buffer = Tensor::uninitialized(host.shape(), host.dtype(), device_);
    stream_->copy(host, buffer);
    return buffer;
  }

  // Two slots, so that a batch is copied into one while the other is in use.
  struct Slot {
    Tensor images, labels, draws, indices;
  };

  data::DataLoader::Epoch& source_;
  Device device_;
  std::optional<CopyStream> stream_;
  Slot slots_[2];
  int next_slot_ = 0;
  std::optional<data::Batch> pending_;
};

// Runs `body`; when it throws, the other processes are told why, rather than only that this one left.
template <typename Body>
History telling_others_of_failure(Strategy& strategy, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    strategy.announce_failure(e.what());
    throw;
  }
}

// 20 bits of a hash of every variable's bits: small enough that sums of it and of its square over
// thousands of replicas stay exact in a double.
double variables_fingerprint(const nn::Sequential& model) {
  std::uint64_t hash = 0;
  for (const auto& v : model.variables())
    for (const float value : v->value.to_vector()) hash = derive_seed(hash, std::bit_cast<std::uint32_t>(value));
  return static_cast<double>(hash >> 44);
}

// Records fit()'s timeline and writes it however fit() ends (a failed run's timeline shows where it stopped).
class TimelineRecording {
 public:
  TimelineRecording(const std::filesystem::path& path, const Strategy& strategy) {
    if (path.empty()) return;
    const std::string process = strategy.process_name();
    if (const char* parts = std::getenv("COHORT_TIMELINE_PARTS"); parts != nullptr && *parts != '\0') {
      // cohort-launch merges the parts, in file-name order, into the file asked for.
      std::error_code ignored;
      std::filesystem::create_directories(parts, ignored);
      file_ = std::filesystem::path(parts) / fmt::format("{:06}-{}.json", strategy.process_index(), process_label(process));
      merge_into_ = std::filesystem::absolute(path);
      timeline::check_writable(merge_into_);
    } else if (!process.empty()) {
      file_ = path.parent_path() / (path.stem().string() + "." + process_label(process) + path.extension().string());
    } else {
      file_ = path;
    }
    timeline::check_writable(file_);  // now, not after the run
    timeline::start(process.empty() ? "process" : process);
  }
  ~TimelineRecording() {
    if (file_.empty()) return;
    try {
      timeline::stop_and_write(file_, merge_into_);
      if (merge_into_.empty()) log::info("timeline written to {}", file_.string());
    } catch (const std::exception& e) {
      log::warning("{}", e.what());
    }
  }
  TimelineRecording(const TimelineRecording&) = delete;
  TimelineRecording& operator=(const TimelineRecording&) = delete;

 private:
  std::filesystem::path file_, merge_into_;
};

}  // namespace

Trainer::Trainer(nn::Sequential& model, std::unique_ptr<optim::Optimizer> optimizer, std::shared_ptr<Strategy> strategy,
                 TrainerOptions options)
    : model_(model),
      optimizer_(std::move(optimizer)),
      strategy_(std::move(strategy)),
      loss_(std::move(options.loss)),
      metrics_(std::move(options.metrics)),
      capture_evaluation_(options.capture_evaluation),
      captured_(std::make_unique<StepCapture>()) {
  COHORT_CHECK(optimizer_ != nullptr && strategy_ != nullptr, "Trainer needs an optimizer and a strategy");
  if (metrics_.empty() && (nn::is_categorical(loss_) || std::holds_alternative<nn::BinaryCrossentropy>(loss_)))
    metrics_.push_back(nn::Metric::accuracy());
  for (std::size_t i = 0; i < metrics_.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      COHORT_CHECK(metrics_[i].name() != metrics_[j].name(), "metric '{}' is listed twice", metrics_[i].name());
}

Trainer::~Trainer() = default;
Trainer::Trainer(Trainer&&) noexcept = default;

Trainer::Totals Trainer::new_totals() const { return {0.0, RunningSums(model_.device(), 1 + static_cast<int>(metrics_.size()))}; }

std::vector<double> Trainer::read(const Totals& totals) {
  std::vector<double> values{totals.samples};
  const std::vector<double> sums = [&] {
    if (totals.sums.read_is_free()) return totals.sums.read();
    const timeline::Span span("device", "read loss and metrics");
    return totals.sums.read();
  }();
  values.insert(values.end(), sums.begin(), sums.end());
  return values;
}

Logs Trainer::logs_of(const std::vector<double>& values, const std::string& prefix) const {
  const double samples = std::max(values[0], 1.0);
  Logs logs{{prefix + "loss", values[1] / samples}};
  for (std::size_t i = 0; i < metrics_.size(); ++i) logs[prefix + metrics_[i].name()] = values[2 + i] / samples;
  return logs;
}

OrderedLogs Trainer::shown(const Logs& logs, bool with_validation) const {
  OrderedLogs ordered;
  for (const char* prefix : {"", "val_"}) {
    if (*prefix != '\0' && !with_validation) break;
    ordered.emplace_back(std::string(prefix) + "loss", logs.at(std::string(prefix) + "loss"));
    for (const auto& metric : metrics_) ordered.emplace_back(prefix + metric.name(), logs.at(prefix + metric.name()));
  }
  return ordered;
}

void Trainer::check_replica_sum() const {
  if (strategy_->replicas() <= 1 || strategy_->replica_sum() != nullptr) return;
  for (const auto& layer : model_.layers())
    if (layer->replica_sum_elements() > 0)
      throw InvalidArgument(fmt::format(
          "layer '{}' ({}) normalizes over every replica's batch, and under strategy '{}' the {} replicas never sum "
          "together: each worker meets only the servers; use BatchNormalization, or train with ring allreduce",
          layer->name(), layer->type_name(), strategy_->name(), strategy_->replicas()));
}

std::string Trainer::non_finite_advice() const {
  return model_.precision() == nn::Precision::MixedFloat16
             ? ": activations overflow float16 (beyond 65504); lower the learning rate or train in mixed_bfloat16"
             : "; lower the learning rate";
}

void Trainer::check_fits(const data::Dataset& dataset) const {
  COHORT_CHECK(dataset.sample_shape() == model_.input_shape(), "data set '{}' has samples of shape {}, the model takes {}",
               dataset.description(), dataset.sample_shape(), model_.input_shape());
  const nn::LossFit fit{.output_shape = model_.output_shape(),
                        .final_activation = model_.final_activation(),
                        .target_shape = dataset.target_shape(),
                        .num_classes = dataset.num_classes()};
  try {
    nn::check_loss_fits(loss_, fit);
    for (const auto& metric : metrics_) metric.check_fits(loss_, fit);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("{} (model output {}, last layer '{}', data set '{}')", e.what(), model_.output_shape(),
                                      model_.last_layer_name(), dataset.description()));
  }
}

Trainer::Scored Trainer::score(const Tensor& images, bool inference_only) {
  const bool fused = nn::fuses_final_activation(loss_, model_.final_activation());
  const Tensor prediction = inference_only ? (fused ? model_.infer_logits(images) : model_.infer(images))
                                           : (fused ? model_.forward_logits(images) : model_.forward(images));
  return {prediction, fused || nn::expects_logits(loss_)};
}

void Trainer::add_to(Totals& totals, const Scored& scored, const Tensor& targets, const Tensor& gradient) const {
  totals.samples += static_cast<double>(scored.prediction.dim(0));
  nn::add_loss(loss_, scored.prediction, scored.logits, targets, totals.sums, 0, gradient);
  for (std::size_t i = 0; i < metrics_.size(); ++i)
    metrics_[i].add_batch_sum(loss_, scored.prediction, scored.logits, targets, totals.sums, 1 + static_cast<int>(i));
}

void Trainer::train_step(const Tensor& images, const Tensor& targets, bool completes_update, EpochTotals& epoch_totals,
                         bool check_loss) {
  const std::int64_t samples = images.dim(0);
  const std::int64_t update_samples = accumulated_samples_ + samples;
  // An empty batch is this replica's empty share of an epoch's last step: it contributes no gradients, but
  // takes part in the sums over the replicas that layers make within a pass.
  if (samples == 0 && model_.replica_sum_elements() > 0) {
    model_.forward_without_batch();
    if (completes_update) {
      strategy_->begin_gradients(model_, update_samples);
      model_.backward_without_batch([&](std::span<const nn::VariablePtr> ready) {
        accumulator_.finish(ready, 0, update_samples);
        strategy_->gradients_ready(ready);
      });
      strategy_->apply_gradients(model_, *optimizer_, update_samples);
      accumulated_samples_ = 0;
    } else {
      model_.backward_without_batch();
      accumulated_samples_ = update_samples;
    }
    return;
  }
  if (samples > 0) {
    const Scored scored = score(images, false);
    const Tensor& prediction = scored.prediction;
    if (!output_gradient_.defined() || output_gradient_.shape() != prediction.shape() ||
        output_gradient_.device() != prediction.device())
      output_gradient_ = Tensor(prediction.shape(), prediction.device());
    {
      const timeline::Span span("forward", "loss");
      add_to(epoch_totals.training, scored, targets, output_gradient_);
    }
    if (epoch_totals.first_unread_step < 0) epoch_totals.first_unread_step = optimizer_->iterations();
    epoch_totals.last_unread_step = optimizer_->iterations();
    if (check_loss) read_training_totals(epoch_totals);
    if (loss_scale_) ops::scale(output_gradient_, loss_scale_->value());
    if (completes_update) {
      // Each layer's gradients, made final, go to the strategy while the layers before it are computed.
      strategy_->begin_gradients(model_, update_samples);
      model_.backward(output_gradient_, [&](std::span<const nn::VariablePtr> ready) {
        accumulator_.finish(ready, samples, update_samples);
        strategy_->gradients_ready(ready);
      });
    } else {
      model_.backward(output_gradient_);
      accumulator_.add(model_.trainable_variables(), samples);
    }
  }
  if (!completes_update) {
    accumulated_samples_ = update_samples;
    return;
  }
  if (samples == 0) accumulator_.finish(model_.trainable_variables(), 0, update_samples);
  strategy_->apply_gradients(model_, *optimizer_, update_samples);
  accumulated_samples_ = 0;
}

Trainer::Totals Trainer::evaluate_share(const data::Dataset& dataset, std::int64_t batch_size, int replica, int replicas,
                                        bool capture) {
  COHORT_CHECK(batch_size > 0, "batch size must be positive, got {}", batch_size);
  ModeGuard mode(model_);
  model_.eval();
  data::LoaderOptions options;
  options.batch_size = batch_size;
  options.shuffle = false;
  options.prefetch = 1;
  options.replica = replica;
  options.replicas = replicas;
  options.pinned = model_.device() != Device::CPU;
  const data::DataLoader loader(dataset, options);
  Totals totals = new_totals();
  auto host_batches = loader.epoch(0);
  DeviceBatches batches(*host_batches, model_.device());
  // On a device that records, each full batch after the first replays the recorded evaluation of one.
  capture = capture && model_.device() != Device::CPU && !evaluation_not_captured_ &&
            model_.first_uncapturable_layer() == nullptr;
  StepCapture captured;
  const auto evaluate_batch = [&](const Tensor& images, const Tensor& labels) {
    add_to(totals, score(images, true), labels);
  };
  while (auto batch = batches.next()) {
    const std::int64_t samples = batch->images.dim(0);
    if (samples == 0) continue;
    if (!capture || samples != batch_size) {
      evaluate_batch(batch->images, batch->labels);
      continue;
    }
    const StepCapture::Step step{
        .run = evaluate_batch,
        .redo_host_part = [&] { totals.samples += static_cast<double>(samples); },
        .save_host_part = [&]() -> std::function<void()> {
          return [&, before = totals.samples] { totals.samples = before; };
        }};
    if (const auto failure = captured.run(batch->images, batch->labels, model_, nullptr, step)) {
      capture = false;
      evaluation_not_captured_ = true;
      log::warning("evaluating a batch could not be captured on {}, so this trainer evaluates every batch op by op: {}",
                   device_name(model_.device()), *failure);
    }
  }
  return totals;
}

void Trainer::agree(TrainingControl& control, std::string_view moment) {
  control.withdraw_local_rate();
  const auto requested = control.requested_learning_rate();
  // The factors' sum and sum of squares reveal, identically on every process, a factor that differs. Then
  // which processes asked for a stop or a rate, so that the chief can say who decided.
  const double factor = optimizer_->learning_rate_factor();
  const int replicas = strategy_->replicas();
  std::vector<double> votes{control.stop_requested() ? 1.0 : 0.0, requested ? 1.0 : 0.0, requested.value_or(0.0), factor,
                            factor * factor};
  votes.resize(kVotes + 2 * static_cast<std::size_t>(replicas), 0.0);
  const auto me = static_cast<std::size_t>(strategy_->process_index());
  if (me < static_cast<std::size_t>(replicas)) {
    votes[kVotes + me] = votes[0];
    votes[kVotes + static_cast<std::size_t>(replicas) + me] = votes[1];
  }
  const bool agreed = strategy_->sum_over_replicas(votes);
  if (agreed) {
    const double mean = votes[3] / replicas;
    if (votes[4] / replicas - mean * mean > 1e-12 * mean * mean)
      throw Error(fmt::format("the processes' learning rates differ (this one's is {:.6g}): a callback changed the optimizer's "
                              "rate directly; use TrainingControl::set_learning_rate, which every process agrees on",
                              optimizer_->learning_rate()));
    if (strategy_->is_chief() && replicas > 1) report_requests(votes, moment);
  } else if (replicas > 1) {
    warn_unagreed(votes, moment);
  }
  // Without agreement, the servers update with the chief's rate: a worker's own request would only mislabel its logs.
  const bool rate_has_effect = agreed || replicas == 1 || strategy_->is_chief() || !strategy_->variables_on_servers();
  if (votes[1] > 0 && rate_has_effect) optimizer_->set_learning_rate(votes[2] / votes[1]);
  control.set_agreed(votes[0] > 0);
}

void Trainer::warn_unagreed(const std::vector<double>& votes, std::string_view moment) const {
  const std::string me = strategy_->process_name();
  const std::string strategy = strategy_->name();
  const bool chief = strategy_->is_chief();
  if (votes[0] > 0 && chief)
    log::warning("{} asked to stop {}: under {} the processes do not wait for each other to agree, and the chief's stop "
                 "ends the run for every process",
                 me, moment, strategy);
  else if (votes[0] > 0)
    log::warning("{} asked to stop {}, but under {} the processes do not wait for each other to agree: it applies to "
                 "this process alone",
                 me, moment, strategy);
  if (votes[1] == 0) return;
  if (!strategy_->variables_on_servers())
    log::warning("{} asked to change the learning rate {}, but under {} the processes do not wait for each other to agree: "
                 "it applies to this process alone",
                 me, moment, strategy);
  else if (chief)  // the servers update every variable with the chief's rate, whoever pushes
    log::warning("{} asked for learning rate {:.6g} {}: under {} the processes do not wait for each other to agree, and "
                 "the servers take the chief's rate for every worker's updates",
                 me, votes[2], moment, strategy);
  else
    log::warning("{} asked for learning rate {:.6g} {}, but under {} the processes do not wait for each other to agree "
                 "and the servers update with the chief's rate: the request has no effect",
                 me, votes[2], moment, strategy);
}

void Trainer::check_required_everywhere(const TrainingControl& control) {
  std::vector<std::string> required = control.required_on_every_process();
  std::sort(required.begin(), required.end());
  std::string joined = fmt::format("{}", fmt::join(required, ", "));
  // Each process's list travels in a slot of its own, a character per value, so that every process can name
  // which ones run what.
  constexpr std::size_t kSlot = 160;
  if (joined.size() > kSlot) joined = joined.substr(0, kSlot - 3) + "...";
  const auto replicas = static_cast<std::size_t>(strategy_->replicas());
  const auto me = static_cast<std::size_t>(strategy_->process_index());
  std::vector<double> slots(replicas * kSlot, 0.0);
  if (me < replicas)
    for (std::size_t i = 0; i < joined.size(); ++i) slots[me * kSlot + i] = static_cast<unsigned char>(joined[i]);
  if (!strategy_->sum_over_replicas(slots)) return;
  // The processes grouped by what they run, in rank order.
  std::vector<std::pair<std::string, std::vector<std::string>>> groups;
  for (std::size_t r = 0; r < replicas; ++r) {
    std::string runs;
    for (std::size_t i = 0; i < kSlot && slots[r * kSlot + i] != 0; ++i) runs.push_back(static_cast<char>(slots[r * kSlot + i]));
    auto group = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == runs; });
    if (group == groups.end()) group = groups.insert(groups.end(), {runs, {}});
    group->second.push_back(strategy_->replica_name(static_cast<int>(r)));
  }
  if (groups.size() == 1) return;
  std::vector<std::string> parts;
  for (const auto& [runs, names] : groups)
    parts.push_back(fmt::format("{} run{} {}", fmt::join(names, ", "), names.size() == 1 ? "s" : "",
                                runs.empty() ? "none of them" : runs));
  throw InvalidArgument(fmt::format("the processes that train differ in the callbacks that must run on every process: {}. "
                                    "A callback that changes the variables itself must run everywhere, or the replicas would part",
                                    fmt::join(parts, "; ")));
}

void Trainer::report_requests(const std::vector<double>& votes, std::string_view moment) const {
  const auto replicas = static_cast<std::size_t>(strategy_->replicas());
  const auto who = [&](std::size_t first) {
    std::vector<std::string> names;
    for (std::size_t r = 0; r < replicas; ++r)
      if (votes[first + r] > 0) names.push_back(strategy_->replica_name(static_cast<int>(r)));
    return fmt::format("{}", fmt::join(names, ", "));
  };
  if (votes[0] > 0) log::info("{} asked to stop {}: every process stops", who(kVotes), moment);
  if (votes[1] > 0)
    log::info("{} asked for learning rate {:.6g} {}: every process takes it", who(kVotes + replicas),
              votes[2] / votes[1], moment);
}

void Trainer::agree_on_cpu_kernels(TrainingPosition& position) {
  if (!gemm_path_named_by_setting()) {
    if (!position.gemm_path.empty()) {
      if (const auto recorded = gemm_path_named(position.gemm_path)) set_gemm_path(*recorded);
      else if (strategy_->is_chief())
        log::warning("the checkpoint's matrix products went through {}, which this build lacks: the resumed run rounds "
                     "differently from the interrupted one",
                     position.gemm_path);
    }
    // Under COHORT_GEMM=fastest each process's own timing could choose differently; the chief's choice (or
    // the recorded one) is the job's.
    std::array<double, 1> chosen{strategy_->is_chief() ? 1.0 + static_cast<int>(gemm_path()) : 0.0};
    if (strategy_->sum_over_replicas(chosen)) set_gemm_path(static_cast<GemmPath>(static_cast<int>(chosen[0]) - 1));
  }
  position.gemm_path = gemm_path_name(gemm_path());
  if (!cpu_isa_named_by_setting() && !position.cpu_isa.empty() && !use_cpu_isa_named(position.cpu_isa) && strategy_->is_chief())
    log::warning("the checkpoint's convolutions ran the {} kernels, which this processor or build lacks: the resumed run "
                 "rounds differently from the interrupted one",
                 position.cpu_isa);
  position.cpu_isa = cpu_isa_name();
}

History Trainer::fit(const data::Dataset& train, const FitOptions& options) {
  // The same main() runs in every process of a job: where this one serves, fit() is serve().
  if (strategy_->service() != nullptr)
    return serve({.checkpoint_dir = options.checkpoint_dir, .resume = options.resume, .timeline = options.timeline});
  return telling_others_of_failure(*strategy_, [&] { return run(train, options); });
}

History Trainer::serve(const ServeOptions& options) {
  return telling_others_of_failure(*strategy_, [&] {
    Service* service = strategy_->service();
    COHORT_CHECK(service != nullptr, "{} trains under strategy '{}': serve() is for the processes that serve (parameter servers)",
                 strategy_->process_name().empty() ? "this process" : strategy_->process_name(), strategy_->name());
    const TimelineRecording timeline_recording(options.timeline, *strategy_);
    if ((options.resume || restarted_by_launcher()) && !options.checkpoint_dir.empty())
      strategy_->restore_checkpoint(options.checkpoint_dir, model_, *optimizer_);
    return service->serve(model_, *optimizer_, options);
  });
}

// What one fit() carries from step to step.
struct Trainer::FitState {
  FitState(Trainer& trainer, const data::Dataset& train, const FitOptions& options, bool chief)
      : train(train), options(options), chief(chief), verbose(chief && options.verbosity != Verbosity::Silent),
        control(trainer, chief) {}

  const data::Dataset& train;
  const FitOptions& options;
  const bool chief, verbose;
  TrainingPosition position;
  std::optional<data::DataLoader> loader;
  std::optional<data::ImageExpander> expander;  // where the device expands byte images (FitOptions::augmentation)
  Tensor resident_images;                       // the training set's, on the device (FitOptions::resident_images)
  DataShare share;
  std::int64_t epochs = 0, batches_per_epoch = 0, accumulate = 1;
  TrainingControl control;
  // Whether the processes agree at all (not under backup workers), and whether after every step.
  bool processes_agree = false, agree_after_steps = false;
  // Whether each step reads its loss before its backward pass (see start_callbacks); else reads wait for a
  // redraw, a callback, a checkpoint or the epoch's end.
  bool checks_each_step = true;
  bool deferral_told = false;  // a mid-epoch request that waits for the epoch's end was warned about
  Logs last_logs;
  std::optional<Logs> partial_epoch;  // reported, but the checkpoint resumes inside it
  bool step_limit_reached = false;
  bool run_ended = false;  // another process ended the run (a parameter-server chief that stopped)
  bool capture_steps = false;  // FitOptions::capture_steps, where this fit's steps may be captured
};

History Trainer::run(const data::Dataset& train, const FitOptions& options) {
  check_fit_arguments(train, options);
  FitState fit(*this, train, options, strategy_->is_chief());
  make_checkpoint_directory(fit);
  const TimelineRecording timeline_recording(options.timeline, *strategy_);
  resume(fit);
  optimizer_->to(model_.device());
  start_precision(fit);
  check_replica_sum();
  strategy_->initialize(model_, *optimizer_);  // after a resume, so that all processes start from the chief's
  const ReplicaSumBinding replica_sum(model_, strategy_->replica_sum());
  agree_on_cpu_kernels(fit.position);
  agree_on_start();
  report_setup(fit);
  plan_epochs(fit);
  start_callbacks(fit);
  const ModeGuard mode(model_);
  for (std::int64_t epoch = fit.position.epoch;
       epoch < fit.epochs && !fit.control.stopping() && !fit.run_ended && !fit.step_limit_reached; ++epoch)
    if (!train_epoch(fit, epoch)) break;
  return finish_run(fit);
}

void Trainer::check_fit_arguments(const data::Dataset& train, const FitOptions& options) const {
  check_settings();
  check_cpu_kernel_settings();
  COHORT_CHECK(options.epochs > 0 || options.max_steps > 0, "fit() needs epochs > 0 or max_steps > 0");
  COHORT_CHECK(train.size() > 0, "fit() got an empty training set '{}'", train.description());
  COHORT_CHECK(options.validation == nullptr || options.validation->size() > 0, "fit() got an empty validation set '{}'",
               options.validation->description());
  COHORT_CHECK(options.accumulate_steps >= 1, "accumulate_steps must be at least 1, got {}", options.accumulate_steps);
  if (options.augmentation) {
    COHORT_CHECK(options.transforms.empty(), "fit() got both transforms and an image augmentation: the augmentation "
                 "describes the whole pipeline (normalization included)");
    COHORT_CHECK(train.stores_bytes() && train.sample_shape().rank() == 3,
                 "fit()'s image augmentation needs a training set of 8-bit (height, width, channels) images (an "
                 "ImageDataset); '{}' of samples {} is not one", train.description(), train.sample_shape());
    data::transforms_of(*options.augmentation);  // its parameters checked before training
  }
  COHORT_CHECK(!options.resident_images || options.augmentation,
               "fit()'s resident_images keeps 8-bit images on the device for an image augmentation, and none was given "
               "(FitOptions::augmentation)");
  check_fits(train);
  if (options.validation != nullptr) check_fits(*options.validation);
}

void Trainer::make_checkpoint_directory(const FitState& fit) const {
  const std::filesystem::path& directory = fit.options.checkpoint_dir;
  if (directory.empty() || !fit.chief) return;
  std::error_code made;
  std::filesystem::create_directories(directory, made);
  if (made) throw IoError(fmt::format("cannot create checkpoint directory {}: {}", directory.string(), made.message()));
}

void Trainer::resume(FitState& fit) {
  const std::filesystem::path& directory = fit.options.checkpoint_dir;
  fit.position = {.data_seed = fit.options.seed};
  if (!(fit.options.resume || restarted_by_launcher()) || directory.empty()) return;
  if (auto restored = strategy_->restore_checkpoint(directory, model_, *optimizer_)) {
    fit.position = std::move(*restored);
    optimizer_->set_learning_rate_factor(fit.position.learning_rate_factor);
    if (fit.verbose)
      log::info("resumed from {}: epoch {}, batch {}, step {}", directory.string(), fit.position.epoch + 1,
                fit.position.batch_in_epoch, fit.position.global_step);
  } else if (fit.verbose) {
    log::info("no checkpoint in {} to resume from: training from the start", directory.string());
  }
}

void Trainer::start_precision(const FitState& fit) {
  const TrainingPosition& position = fit.position;
  const std::string_view precision = nn::precision_name(model_.precision());
  if (fit.verbose && !position.precision.empty() && position.precision != precision)
    log::warning("the checkpoint was written under precision {}, this run is {}: its float32 variables carry over{}",
                 position.precision, precision,
                 position.loss_scale > 0 && model_.precision() != nn::Precision::MixedFloat16 ? ", its loss scale does not" : "");
  if (model_.precision() != nn::Precision::MixedFloat16) return;
  loss_scale_ = position.loss_scale > 0 ? LossScale(position.loss_scale, position.loss_scale_finite_steps) : LossScale();
  COHORT_CHECK(strategy_->set_loss_scale(&*loss_scale_),
               "mixed_float16 needs dynamic loss scaling, whose skipped steps every process must agree on, and with "
               "strategy '{}' each server may count other workers' gradients; train in mixed_bfloat16 (no loss "
               "scaling), or without backup workers",
               strategy_->name());
}

void Trainer::agree_on_start() {
  // Replicas that compute in different types would average gradients of different models, and replicas
  // that start from different variables (a strategy whose initialize() did not give them the chief's)
  // would train apart, silently. A fingerprint and its square agree only where every replica's is the same.
  const double precision = static_cast<double>(model_.precision());
  const double fingerprint = strategy_->replicas() > 1 ? variables_fingerprint(model_) : 0.0;
  std::array<double, 4> sums{precision, 1.0, fingerprint, fingerprint * fingerprint};
  if (!strategy_->sum_over_replicas(sums)) return;
  const double replicas = sums[1];
  if (sums[0] != precision * replicas)
    throw InvalidArgument(fmt::format("the training processes disagree on the precision policy: this one trains in {}; "
                                      "give every process the same --precision",
                                      nn::precision_name(model_.precision())));
  if (sums[2] != fingerprint * replicas || sums[3] != fingerprint * fingerprint * replicas)
    throw InvalidArgument(fmt::format("the replicas start from different variables after strategy '{}' initialized them: its "
                                      "initialize() must give every replica the same values (the chief's, as "
                                      "ProcessGroup::broadcast_from_chief does)",
                                      strategy_->name()));
}

void Trainer::report_setup(const FitState& fit) const {
  if (!fit.verbose) return;
  if (model_.precision() != nn::Precision::Float32) {
    const DType compute = nn::compute_dtype(model_.precision());
    log::info("precision {}: float32 variables, layers computing in {} ({})", nn::precision_name(model_.precision()),
              dtype_name(compute), kernels_for(model_.device(), compute));
  }
  const std::string setup = strategy_->setup_report();
  if (!setup.empty()) fmt::print("{}", setup);
  const FitOptions& options = fit.options;
  const TrainingPosition& position = fit.position;
  if (position.global_step == 0) return;
  if (options.epochs > 0 && position.epoch >= options.epochs)
    log::info("the run in {} has finished its {} epoch{}: nothing is left to train (more epochs train on from it)",
              options.checkpoint_dir.string(), options.epochs, options.epochs == 1 ? "" : "s");
  else if (options.max_steps > 0 && position.global_step >= options.max_steps)
    log::info("the run in {} has taken its {} steps: nothing is left to train (a higher step limit trains on from it)",
              options.checkpoint_dir.string(), options.max_steps);
}

void Trainer::plan_epochs(FitState& fit) {
  const FitOptions& options = fit.options;
  fit.epochs = options.epochs > 0 ? options.epochs : std::numeric_limits<std::int64_t>::max();
  fit.share = strategy_->data_share();
  // An augmentation runs on the model's device, or as the same transforms on the CPU's loader thread.
  const bool expand_on_device = options.augmentation && model_.device() != Device::CPU;
  data::LoaderOptions loader_options{
      .batch_size = options.batch_size,
      .shuffle = options.shuffle,
      .seed = fit.position.data_seed + fit.share.seed_offset,
      .transforms = options.augmentation && !expand_on_device ? data::transforms_of(*options.augmentation) : options.transforms,
      .replica = fit.share.replica,
      .replicas = fit.share.replicas,
      .pinned = model_.device() != Device::CPU,
      .byte_images = expand_on_device ? options.augmentation : std::nullopt,
      .sample_indices_only = expand_on_device && options.resident_images};
  if (expand_on_device) fit.expander.emplace(*options.augmentation, fit.train.sample_shape()[2], model_.device());
  if (loader_options.sample_indices_only) fit.resident_images = data::stored_images(fit.train, model_.device());
  fit.loader.emplace(fit.train, loader_options, strategy_->sampler(fit.train.size(), loader_options.seed, options.shuffle));
  fit.batches_per_epoch = fit.loader->batches_per_epoch();
  fit.accumulate = options.accumulate_steps;
  if (!fit.verbose) return;
  // With EachWorkerFullPass every replica reads the whole set: an epoch then means replicas passes.
  const bool every_replica_reads_all = fit.share.replicas == 1 && strategy_->replicas() > 1;
  log::info("training on {} with strategy '{}', loss {}: {} samples per epoch{}, global batch {} = {} replica(s) x {}{}, "
            "{} steps per epoch",
            fit.train.description(), strategy_->name(), nn::loss_name(loss_),
            fit.loader->samples_per_epoch() * (every_replica_reads_all ? strategy_->replicas() : 1),
            every_replica_reads_all ? " (every replica reads the whole set)" : "",
            options.batch_size * strategy_->replicas() * fit.accumulate, strategy_->replicas(), options.batch_size,
            fit.accumulate > 1 ? fmt::format(" x {} accumulated", fit.accumulate) : "",
            (fit.batches_per_epoch + fit.accumulate - 1) / fit.accumulate);
  if (fit.resident_images.defined())
    log::info("images: the training set's {} of 8-bit values resident on {}, {} there",
              mebibytes(static_cast<double>(fit.resident_images.bytes())), device_name(model_.device()),
              data::describe(*options.augmentation));
  else if (fit.expander)
    log::info("images: copied to {} as 8-bit values, {} there", device_name(model_.device()),
              data::describe(*options.augmentation));
  else if (options.augmentation)
    log::info("images: {} on the loader's thread{}", data::describe(*options.augmentation),
              options.resident_images ? " (resident images are for a device; this model trains on the CPU)" : "");
  if (fit.accumulate > fit.batches_per_epoch)
    log::warning("accumulate_steps {} exceeds the {} batches of an epoch: each update takes one epoch's", fit.accumulate,
                 fit.batches_per_epoch);
}

void Trainer::start_callbacks(FitState& fit) {
  const auto& callbacks = fit.options.callbacks;
  for (auto& callback : callbacks) callback->on_train_begin(fit.control);
  check_required_everywhere(fit.control);
  // Where steps go in lockstep, the processes agree after every step if any has a callback, also one
  // without callbacks (a logger on the chief alone must not leave the others waiting).
  std::array<double, 1> with_callbacks{callbacks.empty() ? 0.0 : 1.0};
  fit.processes_agree = strategy_->sum_over_replicas(with_callbacks);
  fit.agree_after_steps =
      strategy_->steps_in_lockstep() && (fit.processes_agree ? with_callbacks[0] > 0 : !callbacks.empty());
  // A loss that is not finite stops its own step, before the update, where reading it costs nothing (the CPU);
  // under mixed_float16, whose loss scale waits for every step's gradients anyway and would otherwise skip bad
  // steps until it gives up; and where the processes do not step in lockstep, as nothing else would stop a bad
  // process's gradients from reaching the others' variables.
  fit.checks_each_step = model_.device() == Device::CPU || model_.precision() == nn::Precision::MixedFloat16 ||
                         (strategy_->replicas() > 1 && !(fit.processes_agree && strategy_->steps_in_lockstep()));
  fit.capture_steps = fit.options.capture_steps && steps_capturable(fit);
  agree(fit.control, "at the start of training");
}

bool Trainer::steps_capturable(const FitState& fit) const {
  // The CPU runs each op as it is called; every other device records (tensor/capture.hpp).
  if (model_.device() == Device::CPU || strategy_->replicas() != 1 || !strategy_->synchronizer().capturable() ||
      fit.accumulate != 1 || fit.checks_each_step || loss_scale_)
    return false;
  if (const nn::Layer* layer = model_.first_uncapturable_layer()) {
    if (fit.verbose)
      log::info("layer '{}' ({}) does not say that it may be captured (Layer::capturable), so every step runs op by op",
                layer->name(), layer->type_name());
    return false;
  }
  return true;
}

void Trainer::save(FitState& fit) {
  if (fit.options.checkpoint_dir.empty()) return;
  TrainingPosition& position = fit.position;
  position.learning_rate_factor = optimizer_->learning_rate_factor();
  position.loss_scale = loss_scale_ ? loss_scale_->value() : 0.0f;
  position.loss_scale_finite_steps = loss_scale_ ? loss_scale_->finite_steps() : 0;
  position.precision = nn::precision_name(model_.precision());
  strategy_->save_checkpoint(fit.options.checkpoint_dir, model_, *optimizer_, position);
  if (fit.verbose) log::info("checkpoint of step {} saved to {}", position.global_step, fit.options.checkpoint_dir.string());
}

bool Trainer::train_epoch(FitState& fit, std::int64_t epoch) {
  const FitOptions& options = fit.options;
  for (auto& callback : options.callbacks) callback->on_epoch_begin(epoch, fit.control);
  agree(fit.control, fmt::format("before epoch {}", epoch + 1));
  if (fit.control.stopping()) return false;
  // One line per epoch: the header and the summary share it.
  if (fit.verbose && options.epochs > 0)
    fmt::print("Epoch {}/{}{}", epoch + 1, options.epochs, options.verbosity == Verbosity::Epochs ? " " : "\n");
  std::fflush(stdout);
  // The bar counts the batches this epoch will really read: a step limit may end it early.
  std::int64_t epoch_batches = fit.batches_per_epoch;
  if (options.max_steps > 0)
    epoch_batches = std::min(epoch_batches,
                             fit.position.batch_in_epoch + (options.max_steps - fit.position.global_step) * fit.accumulate);
  const auto style = options.verbosity == Verbosity::Lines    ? ProgressBar::Style::Lines
                     : options.verbosity == Verbosity::Epochs ? ProgressBar::Style::EpochOnly
                                                              : ProgressBar::Style::Auto;
  ProgressBar progress(epoch_batches, stdout, style, model_.input_shape().rank() == 3 ? "img/s" : "samples/s");
  EpochTotals totals = train_batches(fit, epoch, progress);
  const Logs logs = epoch_logs(fit, epoch, totals);
  if (fit.verbose)
    progress.finish(shown(logs, options.validation != nullptr), logs.at("seconds"), totals.mean_training_seconds,
                    logs.at("samples_per_second"));
  if (fit.verbose && totals.device_memory)
    log::info("{} memory: at most {} in use during a step, {} in use after the epoch, {} reserved",
              device_name(model_.device()), mebibytes(totals.device_memory->step_peak),
              mebibytes(totals.device_memory->in_use), mebibytes(totals.device_memory->reserved));
  if (fit.position.batch_in_epoch >= fit.batches_per_epoch) {
    fit.position.epoch = epoch + 1;
    fit.position.batch_in_epoch = 0;
    fit.position.history.epochs.push_back(logs);
  } else {
    fit.partial_epoch = logs;
  }
  fit.last_logs = logs;
  for (auto& callback : options.callbacks) callback->on_epoch_end(epoch, logs, fit.control);
  agree(fit.control, fmt::format("after epoch {}", epoch + 1));
  fit.deferral_told = false;
  save(fit);
  return true;
}

Trainer::EpochTotals Trainer::train_batches(FitState& fit, std::int64_t epoch, ProgressBar& progress) {
  EpochTotals epoch_totals{.training = new_totals(), .started = Clock::now()};
  const StepCapture::Scope recording_of_this_epoch(*captured_);  // it adds to this epoch's sums
  Totals& totals = epoch_totals.training;
  auto host_batches = fit.loader->epoch(epoch, fit.position.batch_in_epoch);
  DeviceBatches batches(*host_batches, model_.device());
  // Device memory as torch.cuda.max_memory_allocated counts it: the most handed to tensors during each step.
  Allocator* device_memory = model_.device() == Device::CPU ? nullptr : &allocator_for(model_.device());
  accumulated_samples_ = 0;
  std::int64_t passes = 0;  // since the last update
  for (;;) {
    auto batch = [&] {
      const timeline::Span span("data", "wait for batch");
      const auto waited_from = Clock::now();
      auto next = batches.next();
      epoch_totals.data_seconds += seconds_since(waited_from);
      return next;
    }();
    if (!batch) break;
    if (passes == 0)
      for (auto& callback : fit.options.callbacks) callback->on_batch_begin(fit.position.global_step, fit.control);
    model_.train();
    const bool completes_update = ++passes == fit.accumulate || batch->index + 1 >= fit.batches_per_epoch;
    if (device_memory != nullptr) device_memory->reset_peak();
    const Tensor images =
        !fit.expander ? batch->images
                      : (*fit.expander)(batch->indices.defined() ? fit.resident_images : batch->images, batch->indices,
                                        batch->draws);
    run_step(fit, images, batch->labels, completes_update, epoch_totals);
    if (device_memory != nullptr) note_device_memory(*device_memory, epoch_totals);
    fit.position.batch_in_epoch = batch->index + 1;
    // The loss and metrics wait for the device: they are read only where the bar shows them or a callback
    // reads them, and the callbacks' logs hold them only at the steps a callback asked for, on every device
    // and at every verbosity alike. A checkpoint reads them first, not to save a run whose loss went bad.
    const bool draws = fit.verbose && progress.advance(fit.position.batch_in_epoch);
    const std::int64_t step = fit.position.global_step + 1;  // once this batch's update is made
    const bool asked = completes_update && callbacks_read_batch_logs(fit, step);
    if (!draws && !asked && !fit.checks_each_step && completes_update && saves_checkpoint_after(fit.options, step))
      read_training_totals(epoch_totals);
    const Logs values = draws || asked ? logs_of(read_training_totals(epoch_totals), "") : Logs{};
    Logs logs = asked ? values : Logs{};
    logs["samples_per_second"] = totals.samples / seconds_since(epoch_totals.started);  // this process's, so far
    logs["learning_rate"] = optimizer_->learning_rate();
    if (draws) progress.draw(shown(values, false), logs["samples_per_second"]);
    // Checkpoints, limits and stops take effect between updates only.
    if (!completes_update) continue;
    passes = 0;
    if (!after_update(fit, epoch, logs)) break;
  }
  epoch_totals.mean_training_seconds = seconds_since(epoch_totals.started);
  return epoch_totals;
}

void Trainer::run_step(FitState& fit, const Tensor& images, const Tensor& targets, bool completes_update,
                       EpochTotals& epoch_totals) {
  // Only a full batch: an epoch's last, partial one would be a second recording used once.
  if (!fit.capture_steps || !completes_update || images.dim(0) != fit.options.batch_size) {
    captured_->drop();
    train_step(images, targets, completes_update, epoch_totals, fit.checks_each_step);
    return;
  }
  const StepCapture::Step step{
      .run = [&](const Tensor& images_in, const Tensor& targets_in) {
        train_step(images_in, targets_in, true, epoch_totals, false);
      },
      .redo_host_part = [&] {
        if (epoch_totals.first_unread_step < 0) epoch_totals.first_unread_step = optimizer_->iterations();
        epoch_totals.last_unread_step = optimizer_->iterations();
        epoch_totals.training.samples += static_cast<double>(images.dim(0));
        model_.set_step(model_.step() + 1);
        optimizer_->finish_step();
      },
      .save_host_part = [&]() -> std::function<void()> {
        return [&, iterations = optimizer_->iterations(), model_step = model_.step(),
                samples = epoch_totals.training.samples, first = epoch_totals.first_unread_step,
                last = epoch_totals.last_unread_step] {
          optimizer_->set_iterations(iterations);
          model_.set_step(model_step);
          epoch_totals.training.samples = samples;
          epoch_totals.first_unread_step = first;
          epoch_totals.last_unread_step = last;
        };
      }};
  if (const auto failure = captured_->run(images, targets, model_, optimizer_.get(), step)) {
    fit.capture_steps = false;
    log::warning("the training step could not be captured on {}, so every step runs op by op: {}",
                 device_name(model_.device()), *failure);
  }
}

std::vector<double> Trainer::read_training_totals(EpochTotals& epoch_totals) const {
  std::vector<double> values = read(epoch_totals.training);
  const std::int64_t first = epoch_totals.first_unread_step, last = epoch_totals.last_unread_step;
  if (!std::isfinite(values[1]))
    throw Error(fmt::format("the training loss became {} {} (learning rate {:.3g}){}", values[1],
                            first == last ? fmt::format("at step {}", last) : fmt::format("between steps {} and {}", first, last),
                            optimizer_->learning_rate(), non_finite_advice()));
  epoch_totals.first_unread_step = epoch_totals.last_unread_step = -1;
  return values;
}

bool Trainer::callbacks_read_batch_logs(const FitState& fit, std::int64_t step) {
  return std::any_of(fit.options.callbacks.begin(), fit.options.callbacks.end(),
                     [&](const auto& callback) { return callback->needs_batch_logs(step); });
}

bool Trainer::after_update(FitState& fit, std::int64_t epoch, const Logs& logs) {
  const FitOptions& options = fit.options;
  TrainingControl& control = fit.control;
  const std::int64_t step = ++fit.position.global_step;
  for (auto& callback : options.callbacks) callback->on_batch_end(step, logs, control);
  const bool several = fit.processes_agree && strategy_->replicas() > 1;
  if (fit.agree_after_steps) {
    agree(control, fmt::format("after step {}", step));
  } else if (several) {
    // The request waits for the epoch's end; until then this process keeps the agreed rate, as the others do.
    control.withdraw_local_rate();
    if (!fit.deferral_told && (control.stop_requested() || control.requested_learning_rate())) {
      fit.deferral_told = true;
      log::warning("{} asked to {} after step {}: under {} the processes agree only at the end of an epoch, so it takes "
                   "effect after epoch {}",
                   strategy_->process_name(), control.stop_requested() ? "stop" : "change the learning rate", step,
                   strategy_->name(), epoch + 1);
    }
  }
  if (saves_checkpoint_after(options, step)) {
    // A process whose loss went bad stopped at the read before this checkpoint, but in lockstep its gradients
    // reached every replica: the others wait for it here (its failure ends the wait) rather than save them.
    if (several && !fit.agree_after_steps && !fit.checks_each_step) {
      std::array<double, 1> nothing{0.0};
      strategy_->sum_over_replicas(nothing);
    }
    save(fit);
  }
  fit.step_limit_reached = options.max_steps > 0 && step >= options.max_steps;
  fit.run_ended = strategy_->should_stop();
  if (fit.run_ended && !fit.chief) log::info("{}: the chief ended the run after step {}", strategy_->process_name(), step);
  return !(fit.step_limit_reached || fit.run_ended || control.stopping());
}

void Trainer::note_device_memory(const Allocator& allocator, EpochTotals& epoch_totals) {
  const AllocatorStats stats = allocator.stats();
  if (!epoch_totals.device_memory) epoch_totals.device_memory = DeviceMemory{};
  DeviceMemory& memory = *epoch_totals.device_memory;
  memory.step_peak = std::max(memory.step_peak, stats.peak);
  memory.in_use = stats.in_use;
  memory.reserved = stats.in_use + stats.cached;
  constexpr double kMiB = 1024.0 * 1024.0;
  timeline::counter("device memory (MiB)", {{"in use", static_cast<double>(stats.in_use) / kMiB},
                                            {"step peak", static_cast<double>(stats.peak) / kMiB},
                                            {"reserved", static_cast<double>(memory.reserved) / kMiB}});
}

Logs Trainer::epoch_logs(FitState& fit, std::int64_t epoch, EpochTotals& epoch_totals) {
  const FitOptions& options = fit.options;
  // Over all processes: the training totals, the validation totals of each one's share of the validation
  // set, and the time figures (averaged), so that every History holds the same numbers. Without an
  // agreement each process's figures are its own: its validation covers the whole set, not a share that
  // may be empty.
  Logs strategy_logs;
  strategy_->add_epoch_logs(strategy_logs);
  std::vector<double> sums = read_training_totals(epoch_totals);
  const std::size_t width = sums.size();
  std::vector<double> validation_values(width, 0.0);
  if (options.validation != nullptr)
    validation_values = read(evaluate_share(*options.validation, std::max<std::int64_t>(options.batch_size, 256),
                                            fit.processes_agree ? fit.share.replica : 0,
                                            fit.processes_agree ? fit.share.replicas : 1, options.capture_steps));
  sums.insert(sums.end(), validation_values.begin(), validation_values.end());
  sums.push_back(seconds_since(epoch_totals.started));
  sums.push_back(epoch_totals.mean_training_seconds);
  sums.push_back(epoch_totals.data_seconds);
  for (const auto& [name, value] : strategy_logs) sums.push_back(value);
  const double replicas = strategy_->sum_over_replicas(sums) ? static_cast<double>(strategy_->replicas()) : 1.0;
  const std::vector<double> training_sums(sums.begin(), sums.begin() + static_cast<std::ptrdiff_t>(width));
  const std::vector<double> validation_sums(sums.begin() + static_cast<std::ptrdiff_t>(width),
                                            sums.begin() + static_cast<std::ptrdiff_t>(2 * width));
  Logs logs = logs_of(training_sums, "");
  const double seconds = sums[2 * width] / replicas;
  epoch_totals.mean_training_seconds = sums[2 * width + 1] / replicas;
  std::size_t next = 2 * width + 3;
  for (auto& [name, value] : strategy_logs) logs[name] = sums[next++] / replicas;
  logs["seconds"] = seconds;
  logs["data_seconds"] = sums[2 * width + 2] / replicas;
  if (options.validation != nullptr) logs["validation_seconds"] = seconds - epoch_totals.mean_training_seconds;
  logs["samples_per_second"] = training_sums[0] > 0 ? training_sums[0] / seconds : 0.0;
  logs["learning_rate"] = optimizer_->learning_rate();
  if (options.validation != nullptr) {
    logs.merge(logs_of(validation_sums, std::string(kValidationPrefix)));
    const double loss = logs.at("val_loss");
    if (!std::isfinite(loss))
      throw Error(fmt::format("the validation loss became {} after epoch {}{}", loss, epoch + 1, non_finite_advice()));
  }
  return logs;
}

History Trainer::finish_run(FitState& fit) {
  History result = fit.position.history;
  if (fit.partial_epoch) result.epochs.push_back(*fit.partial_epoch);
  strategy_->finish(result, *optimizer_);
  if (fit.verbose) {
    const std::string report = strategy_->final_report();
    if (!report.empty()) fmt::print("{}", report);
  }
  for (auto& callback : fit.options.callbacks) callback->on_train_end(fit.last_logs);
  return result;
}

Logs Trainer::evaluate(const data::Dataset& dataset, std::int64_t batch_size) {
  check_fits(dataset);
  COHORT_CHECK(dataset.size() > 0, "evaluate() got an empty data set '{}'", dataset.description());
  return logs_of(read(evaluate_share(dataset, batch_size, 0, 1, capture_evaluation_)), "");
}

Tensor Trainer::predict(const Tensor& images, std::int64_t batch_size) {
  COHORT_CHECK(batch_size > 0, "batch size must be positive, got {}", batch_size);
  COHORT_CHECK(images.rank() >= 1 && images.shape().sample() == model_.input_shape(),
               "predict() takes a batch of samples of shape {}, that is (N, {}) for N samples; got {}", model_.input_shape(),
               fmt::join(model_.input_shape().dims(), ", "), images.shape());
  ModeGuard mode(model_);
  model_.eval();
  const std::int64_t n = images.dim(0);
  Tensor outputs(model_.output_shape().batched(n));
  for (std::int64_t begin = 0; begin < n; begin += batch_size) {
    const std::int64_t end = std::min(n, begin + batch_size);
    ops::copy(model_.infer(images.slice(begin, end).to(model_.device())), outputs.slice(begin, end));
  }
  return outputs;
}

}  // namespace cohort::train
