#pragma once
// ProgressBar: Keras-like progress of an epoch: step count, bar, ETA, time per step, the loss first, then
// the metrics in the order given, and the sample rate (img/s for images, samples/s for other inputs), cut
// to the terminal's width. On a terminal it redraws
// one line; otherwise it prints a plain log line about every tenth of the epoch. COHORT_PROGRESS=bar or
// =lines overrides that choice (cohort-launch sets bar for the chief when its own output is a terminal,
// and shows the chief's bar as a live line).
//
//   ProgressBar bar(steps, stdout);
//   bar.update(step, {{"loss", 0.52}, {"accuracy", 0.81}}, images_per_second);  ...  bar.finish(values, seconds, training_seconds, rate);
//   if (bar.advance(step)) bar.draw(read_values(), images_per_second);   // the same, reading values only to draw

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace cohort::train {

// Named values in the order they are shown.
using OrderedLogs = std::vector<std::pair<std::string, double>>;

class ProgressBar {
 public:
  enum class Style { Auto, Bar, Lines, EpochOnly };
  // `rate_unit` names the samples' rate: "img/s", or "samples/s" where the samples are not images.
  ProgressBar(std::int64_t total_steps, std::FILE* out, Style style = Style::Auto, std::string rate_unit = "img/s");

  // advance() and, when it returns true, draw(): the values are needed only when the bar is drawn (on a
  // terminal at most every 100 ms, in lines about every tenth of the epoch), so a caller whose values wait
  // for a device reads them only then.
  void update(std::int64_t steps_done, const OrderedLogs& logs, double samples_per_second);
  // Counts the steps done; true when the bar is due to be drawn now.
  bool advance(std::int64_t steps_done);
  // Draws the bar at the steps of the last advance().
  void draw(const OrderedLogs& logs, double samples_per_second);
  // The epoch's line: `seconds` the whole epoch, validation included (as the History's seconds and
  // samples_per_second), the step time over the `training_seconds` of its steps alone.
  void finish(const OrderedLogs& logs, double seconds, double training_seconds, double samples_per_second);

 private:
  // Columns a drawn line may take: the terminal's (or COLUMNS) less one.
  std::size_t width() const;
  // `full` when it fits, else `compact`, cut to the width if need be.
  std::string fit(const std::string& full, const std::string& compact) const;

  std::int64_t total_;
  std::FILE* out_;
  Style style_;
  std::string rate_unit_;
  std::int64_t first_step_ = -1;
  std::int64_t steps_done_ = -1;  // the last update's; the whole epoch until one comes
  std::int64_t next_plain_report_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace cohort::train
