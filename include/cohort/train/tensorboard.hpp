#pragma once
// Writes a run's curves as TensorBoard event files, laid out as Keras's TensorBoard callback lays them:
// LOG_DIR/train and LOG_DIR/validation, a scalar "epoch_<log>" per epoch (validation logs without their
// "val_" prefix, so that train and validation share one chart), "batch_<log>" every update_every_steps
// steps, and a histogram of every variable per epoch. Epoch scalars are at step = epoch index (from 0),
// batch scalars at the optimizer step. Open with `tensorboard --logdir LOG_DIR`.
//
//   fit.callbacks.push_back(std::make_shared<train::TensorBoard>(train::TensorBoardOptions{.log_dir = "logs"}));

#include <cstdint>
#include <filesystem>
#include <memory>

#include "cohort/train/callbacks.hpp"

namespace cohort::train {

class EventFileWriter;

struct TensorBoardOptions {
  std::filesystem::path log_dir;
  std::int64_t update_every_steps = 0;  // batch scalars every N steps; 0: epochs only
  bool histograms = true;
  // The chief's curves only (its epoch logs are every process's), or one set per process, in
  // LOG_DIR/<process name>/train ("chief-0") (batch logs are each process's own share).
  bool every_process = false;
};

class TensorBoard : public Callback {
 public:
  explicit TensorBoard(TensorBoardOptions options);
  ~TensorBoard() override;
  // Creates the run folders and event files: IoError naming the path, before any step, when it cannot.
  void on_train_begin(TrainingControl& control) override;
  void on_batch_end(std::int64_t step, const Logs& logs, TrainingControl& control) override;
  bool needs_batch_logs(std::int64_t step) const override;
  void on_epoch_end(std::int64_t epoch, const Logs& logs, TrainingControl& control) override;
  void on_train_end(const Logs& logs) override;

 private:
  TensorBoardOptions options_;
  std::unique_ptr<EventFileWriter> train_, validation_;
};

}  // namespace cohort::train
