#pragma once
// Callbacks observe fit() (Keras-style hooks) and may stop it early.
//
//   struct StopAtLoss : train::Callback {
//     void on_epoch_end(std::int64_t, const train::Logs& logs, train::TrainingControl& c) override {
//       if (logs.at("loss") < 0.1) c.stop();
//     }
//   };

#include <cstdint>
#include <functional>

#include "cohort/train/logs.hpp"

namespace cohort::train {

class TrainingControl {
 public:
  void stop() { stop_requested_ = true; }
  bool stop_requested() const { return stop_requested_; }

 private:
  bool stop_requested_ = false;
};

class Callback {
 public:
  virtual ~Callback() = default;
  virtual void on_train_begin(TrainingControl&) {}
  virtual void on_epoch_begin(std::int64_t /*epoch*/, TrainingControl&) {}
  // `step` counts optimizer steps since the start of training (resumed runs continue the count).
  virtual void on_batch_end(std::int64_t /*step*/, const Logs& /*logs*/, TrainingControl&) {}
  virtual void on_epoch_end(std::int64_t /*epoch*/, const Logs& /*logs*/, TrainingControl&) {}
  virtual void on_train_end(const Logs& /*logs*/) {}
};

// A callback from plain functions, for the hooks one needs.
struct LambdaCallback : Callback {
  std::function<void(std::int64_t, const Logs&, TrainingControl&)> batch_end, epoch_end;
  void on_batch_end(std::int64_t step, const Logs& logs, TrainingControl& control) override {
    if (batch_end) batch_end(step, logs, control);
  }
  void on_epoch_end(std::int64_t epoch, const Logs& logs, TrainingControl& control) override {
    if (epoch_end) epoch_end(epoch, logs, control);
  }
};

}  // namespace cohort::train
