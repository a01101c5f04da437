#pragma once
// One self-contained HTML page about a run, written by the chief after every epoch (so that a run that
// fails keeps the page of its last epoch) and when fit() ends: curves of the epoch logs (training beside
// validation), each epoch's time split into computing and the communication it waited for, the learning
// rate, the effective global batch, the processes, the parameter servers' placement and traffic, and the
// model. Inline SVG and no script: any browser opens it.
//
//   fit.callbacks.push_back(std::make_shared<train::RunReport>(train::RunReportOptions{.path = "run.html"}));

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "cohort/train/callbacks.hpp"

namespace cohort::train {

class Strategy;

struct RunReportOptions {
  std::filesystem::path path;
  std::string title = "cohort run";
};

class RunReport : public Callback {
 public:
  explicit RunReport(RunReportOptions options);
  // Writes a first page: IoError naming the path, before any step, when it cannot.
  void on_train_begin(TrainingControl& control) override;
  void on_epoch_begin(std::int64_t epoch, TrainingControl& control) override;
  void on_batch_end(std::int64_t step, const Logs& logs, TrainingControl& control) override;
  bool needs_batch_logs(std::int64_t) const override { return false; }  // it counts the steps only
  void on_epoch_end(std::int64_t epoch, const Logs& logs, TrainingControl& control) override;
  void on_train_end(const Logs& logs) override;

  // The page as it would be written now.
  std::string page() const;

 private:
  void write() const;

  RunReportOptions options_;
  bool writing_ = false;  // on the chief
  Strategy* strategy_ = nullptr;
  std::string processes_, setup_, model_summary_, traffic_;
  std::vector<Logs> epochs_;
  std::vector<std::int64_t> steps_;  // optimizer steps per epoch
  std::int64_t first_epoch_ = 0;     // the first epoch this run trained (a resumed run starts later)
  std::int64_t epoch_steps_ = 0;
  bool finished_ = false;
};

}  // namespace cohort::train
