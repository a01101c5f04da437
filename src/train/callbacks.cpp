#include "cohort/train/callbacks.hpp"

#include <fmt/args.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "cohort/core/check.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/logging.hpp"
#include "cohort/nn/weights.hpp"
#include "cohort/tensor/ops.hpp"
#include "cohort/train/trainer.hpp"

namespace cohort::train {
namespace {

// " by more than 0.5" when a monitor must beat its best by min_delta to count as improved.
std::string by_more_than(double min_delta) {
  return min_delta > 0 ? fmt::format(" by more than {:.6g}", min_delta) : std::string();
}

bool larger_is_better(Mode mode, const std::string& monitor) {
  if (mode == Mode::Auto) return monitor.find("acc") != std::string::npos || monitor.find("auc") != std::string::npos;
  return mode == Mode::Max;
}

}  // namespace

BestSoFar::BestSoFar(std::string monitor, Mode mode, std::string owner)
    : monitor_(std::move(monitor)), owner_(std::move(owner)), larger_is_better_(larger_is_better(mode, monitor_)) {}

bool BestSoFar::improves(const Logs& logs, double min_delta) {
  const auto it = logs.find(monitor_);
  if (it == logs.end()) {
    std::string known;
    for (const auto& [name, value] : logs) known += (known.empty() ? "" : ", ") + name;
    throw InvalidArgument(fmt::format("{} monitors '{}', which the epoch's logs lack (they hold {}){}", owner_, monitor_, known,
                                      monitor_.starts_with("val_") ? "; pass FitOptions::validation" : ""));
  }
  const double value = it->second;
  const bool better = !best_ || (larger_is_better_ ? value > *best_ + min_delta : value < *best_ - min_delta);
  if (better) best_ = value;
  return better;
}

void TrainingControl::set_learning_rate(double learning_rate) {
  COHORT_CHECK(std::isfinite(learning_rate) && learning_rate > 0, "a learning rate must be positive and finite, got {}",
               learning_rate);
  if (!factor_before_request_) factor_before_request_ = optimizer().learning_rate_factor();
  requested_learning_rate_ = learning_rate;
  optimizer().set_learning_rate(learning_rate);
}

void TrainingControl::withdraw_local_rate() {
  if (factor_before_request_) optimizer().set_learning_rate_factor(*factor_before_request_);
  factor_before_request_.reset();
}

nn::Sequential& TrainingControl::model() { return trainer_.model(); }
optim::Optimizer& TrainingControl::optimizer() { return trainer_.optimizer(); }

void TrainingControl::require_on_every_process(const std::string& what) {
  if (std::find(required_everywhere_.begin(), required_everywhere_.end(), what) == required_everywhere_.end())
    required_everywhere_.push_back(what);
}

bool TrainingControl::variables_on_servers() const { return trainer_.strategy().variables_on_servers(); }

void TrainingControl::set_agreed(bool stop) {
  stopping_ = stopping_ || stop;
  stop_requested_ = false;
  requested_learning_rate_.reset();
}

void LambdaCallback::on_train_begin(TrainingControl& control) {
  if (train_begin) train_begin(control);
}
void LambdaCallback::on_epoch_begin(std::int64_t epoch, TrainingControl& control) {
  if (epoch_begin) epoch_begin(epoch, control);
}
void LambdaCallback::on_batch_begin(std::int64_t step, TrainingControl& control) {
  if (batch_begin) batch_begin(step, control);
}
void LambdaCallback::on_batch_end(std::int64_t step, const Logs& logs, TrainingControl& control) {
  if (batch_end) batch_end(step, logs, control);
}
void LambdaCallback::on_epoch_end(std::int64_t epoch, const Logs& logs, TrainingControl& control) {
  if (epoch_end) epoch_end(epoch, logs, control);
}
void LambdaCallback::on_train_end(const Logs& logs) {
  if (train_end) train_end(logs);
}

EarlyStopping::EarlyStopping(EarlyStoppingOptions options)
    : options_(std::move(options)), best_(options_.monitor, options_.mode, "EarlyStopping") {
  COHORT_CHECK(options_.patience >= 0 && options_.min_delta >= 0, "EarlyStopping needs patience and min_delta >= 0");
}

void EarlyStopping::on_train_begin(TrainingControl& control) {
  if (options_.restore_best_weights) {
    COHORT_CHECK(!control.variables_on_servers(),
                 "EarlyStopping(restore_best_weights) cannot put back variables that parameter servers hold (the "
                 "servers would keep the last ones); keep the best model with ModelCheckpoint (ModelCheckpointOptions::best_only) instead");
    control.require_on_every_process("EarlyStopping(restore_best_weights)");
  }
  best_.reset();
  waited_ = 0;
  stopped_epoch_.reset();
  best_values_.clear();
}

void EarlyStopping::on_epoch_end(std::int64_t epoch, const Logs& logs, TrainingControl& control) {
  if (best_.improves(logs, options_.min_delta)) {
    waited_ = 0;
    if (options_.restore_best_weights) {
      best_values_.clear();
      for (const auto& v : control.model().variables()) best_values_.push_back(v->value.clone());
      best_epoch_ = epoch + 1;
    }
    return;
  }
  if (++waited_ < options_.patience) return;
  stopped_epoch_ = epoch + 1;
  control.stop();
  if (control.is_chief())
    log::info("early stopping after epoch {}: {} has not improved on {:.6g}{} for {} epoch(s)", epoch + 1, options_.monitor,
              best_.best(), by_more_than(options_.min_delta), waited_);
  restore_best(control);
}

void EarlyStopping::restore_best(TrainingControl& control) {
  if (best_values_.empty()) return;
  const auto variables = control.model().variables();
  for (std::size_t i = 0; i < variables.size(); ++i) ops::copy(best_values_[i], variables[i]->value);
  if (control.is_chief())
    log::info("restored the weights of epoch {}, the best {} ({:.6g})", best_epoch_, options_.monitor, best_.best());
}

ReduceLROnPlateau::ReduceLROnPlateau(ReduceLROnPlateauOptions options)
    : options_(std::move(options)), best_(options_.monitor, options_.mode, "ReduceLROnPlateau") {
  COHORT_CHECK(options_.factor > 0 && options_.factor < 1, "ReduceLROnPlateau needs a factor in (0, 1), got {}",
               options_.factor);
  COHORT_CHECK(options_.patience >= 0 && options_.cooldown >= 0 && options_.min_learning_rate >= 0,
               "ReduceLROnPlateau needs patience, cooldown and min_learning_rate >= 0");
}

void ReduceLROnPlateau::on_epoch_end(std::int64_t epoch, const Logs& logs, TrainingControl& control) {
  const bool improved = best_.improves(logs, options_.min_delta);
  if (cooling_ > 0) --cooling_;
  if (improved) {
    waited_ = 0;
    return;
  }
  if (cooling_ > 0 || ++waited_ < options_.patience) return;
  const double current = control.optimizer().learning_rate();
  const double reduced = std::max(current * options_.factor, options_.min_learning_rate);
  waited_ = 0;
  if (reduced >= current || reduced <= 0) return;
  control.set_learning_rate(reduced);
  cooling_ = options_.cooldown;
  if (control.is_chief())
    log::info("epoch {}: {} has not improved on {:.6g}{}; learning rate {:.3g} -> {:.3g}", epoch + 1, options_.monitor,
              best_.best(), by_more_than(options_.min_delta), current, reduced);
}

ModelCheckpoint::ModelCheckpoint(ModelCheckpointOptions options)
    : options_(std::move(options)), best_(options_.monitor, options_.mode, "ModelCheckpoint") {
  COHORT_CHECK(!options_.path.empty(), "ModelCheckpoint needs a path");
  COHORT_CHECK(options_.keep_last >= 0, "ModelCheckpoint needs keep_last >= 0, got {}", options_.keep_last);
}

void ModelCheckpoint::on_epoch_end(std::int64_t epoch, const Logs& logs, TrainingControl& control) {
  if (options_.best_only && !best_.improves(logs, 0)) return;
  if (!control.is_chief()) return;
  fmt::dynamic_format_arg_store<fmt::format_context> arguments;
  arguments.push_back(fmt::arg("epoch", epoch + 1));
  for (const auto& [name, value] : logs) arguments.push_back(fmt::arg(name.c_str(), value));
  std::filesystem::path path;
  try {
    path = fmt::vformat(options_.path.string(), arguments);
  } catch (const fmt::format_error& e) {
    throw InvalidArgument(fmt::format("ModelCheckpoint path '{}' cannot be formatted with the epoch's logs: {}",
                                      options_.path.string(), e.what()));
  }
  nn::save_weights(control.model(), path);
  std::erase(kept_, path);
  kept_.push_back(path);
  if (options_.keep_last > 0)
    while (static_cast<std::int64_t>(kept_.size()) > options_.keep_last) {
      std::error_code ignored;
      std::filesystem::remove(kept_.front(), ignored);
      kept_.erase(kept_.begin());
    }
}

CSVLogger::CSVLogger(std::filesystem::path path, bool append) : path_(std::move(path)), append_(append) {
  COHORT_CHECK(!path_.empty(), "CSVLogger needs a path");
}

void CSVLogger::on_train_begin(TrainingControl& control) {
  columns_.clear();
  if (!control.is_chief() || append_) return;
  std::ofstream out(path_, std::ios::trunc);
  if (!out) throw IoError(fmt::format("CSVLogger cannot write {}: {}", path_.string(), std::strerror(errno)));
}

void CSVLogger::on_epoch_end(std::int64_t epoch, const Logs& logs, TrainingControl& control) {
  if (!control.is_chief()) return;
  std::string text;
  if (columns_.empty()) {
    for (const auto& [name, value] : logs) columns_.push_back(name);
    std::error_code missing;
    const auto size = std::filesystem::file_size(path_, missing);
    const bool has_rows = append_ && !missing && size > 0;
    if (!has_rows) {
      text += "epoch";
      for (const auto& name : columns_) text += "," + name;
      text += "\n";
    }
  }
  text += fmt::format("{}", epoch + 1);
  for (const auto& name : columns_) {
    const auto it = logs.find(name);
    text += it == logs.end() ? std::string(",") : fmt::format(",{:.6g}", it->second);  // as History::to_csv
  }
  text += "\n";
  std::ofstream out(path_, std::ios::app);
  out << text;
  out.flush();
  if (!out) throw IoError(fmt::format("CSVLogger cannot write {}: {}", path_.string(), std::strerror(errno)));
}

}  // namespace cohort::train
