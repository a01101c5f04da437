#pragma once
// ProgressBar: Keras-like progress of an epoch (step count, bar, ETA, metrics, images/s). On a terminal
// it redraws one line; otherwise it prints a plain log line about every tenth of the epoch.
//
//   ProgressBar bar(steps, stdout);
//   bar.update(step, logs, images_per_second);  ...  bar.finish(logs, seconds);

#include <chrono>
#include <cstdint>
#include <cstdio>

#include "cohort/train/logs.hpp"

namespace cohort::train {

class ProgressBar {
 public:
  // interactive: redraw in place; by default, whether `out` is a terminal.
  ProgressBar(std::int64_t total_steps, std::FILE* out, int interactive = -1);

  void update(std::int64_t steps_done, const Logs& logs, double images_per_second);
  void finish(const Logs& logs, double seconds, double images_per_second);

 private:
  std::int64_t total_;
  std::FILE* out_;
  bool interactive_;
  std::int64_t next_plain_report_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace cohort::train
