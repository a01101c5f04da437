#include "cohort/train/tensorboard.hpp"

#include "cohort/core/check.hpp"
#include "cohort/train/strategy.hpp"
#include "cohort/train/trainer.hpp"
#include "event_file.hpp"
#include "process_label.hpp"

namespace cohort::train {

TensorBoard::TensorBoard(TensorBoardOptions options) : options_(std::move(options)) {
  COHORT_CHECK(!options_.log_dir.empty(), "TensorBoard needs a log directory");
  COHORT_CHECK(options_.update_every_steps >= 0, "TensorBoard: update_every_steps of {} is negative", options_.update_every_steps);
}

TensorBoard::~TensorBoard() = default;

void TensorBoard::on_train_begin(TrainingControl& control) {
  train_.reset();
  validation_.reset();
  if (!options_.every_process && !control.is_chief()) return;
  std::filesystem::path root = options_.log_dir;
  if (options_.every_process)
    if (const std::string name = control.trainer().strategy().process_name(); !name.empty()) root /= process_label(name);
  train_ = std::make_unique<EventFileWriter>(root / "train");
  validation_ = std::make_unique<EventFileWriter>(root / "validation");
}

bool TensorBoard::needs_batch_logs(std::int64_t step) const {
  return train_ && options_.update_every_steps > 0 && step % options_.update_every_steps == 0;
}

void TensorBoard::on_batch_end(std::int64_t step, const Logs& logs, TrainingControl&) {
  if (!needs_batch_logs(step)) return;
  for (const auto& [name, value] : logs) train_->add_scalar("batch_" + name, step, value);
}

void TensorBoard::on_epoch_end(std::int64_t epoch, const Logs& logs, TrainingControl& control) {
  if (!train_) return;
  for (const auto& [name, value] : logs) {
    if (name.starts_with(kValidationPrefix)) validation_->add_scalar("epoch_" + name.substr(kValidationPrefix.size()), epoch, value);
    else train_->add_scalar("epoch_" + name, epoch, value);
  }
  if (options_.histograms)
    for (const auto& variable : control.model().variables()) {
      const std::vector<float> values = variable->value.to_vector();
      train_->add_histogram(variable->name, epoch, values);
    }
  train_->flush();
  validation_->flush();
}

void TensorBoard::on_train_end(const Logs&) {
  if (!train_) return;
  train_->flush();
  validation_->flush();
}

}  // namespace cohort::train
