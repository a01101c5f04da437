#include "cohort/train/progress.hpp"

#include <fmt/format.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdlib>
#include <string_view>

#include "cohort/core/settings.hpp"

namespace cohort::train {
namespace {

constexpr int kBarWidth = 30;

std::string format_duration(double seconds) {
  const auto s = static_cast<long>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60);
  if (s >= 60) return fmt::format("{}:{:02}", s / 60, s % 60);
  return fmt::format("{}s", s);
}

std::string format_step_time(double seconds_per_step) {
  if (seconds_per_step >= 1) return fmt::format("{:.2f}s/step", seconds_per_step);
  if (seconds_per_step >= 1e-3) return fmt::format("{:.0f}ms/step", seconds_per_step * 1e3);
  return fmt::format("{:.0f}us/step", seconds_per_step * 1e6);
}

std::string format_logs(const OrderedLogs& logs) {
  std::string out;
  for (const auto& [name, value] : logs) out += fmt::format(" - {}: {:.4f}", name, value);
  return out;
}

ProgressBar::Style resolve(ProgressBar::Style style, std::FILE* out) {
  if (style != ProgressBar::Style::Auto) return style;
  if (const auto forced = choice_setting("COHORT_PROGRESS", kProgressSpellings))
    return *forced == "bar" ? ProgressBar::Style::Bar : ProgressBar::Style::Lines;
  return isatty(fileno(out)) != 0 ? ProgressBar::Style::Bar : ProgressBar::Style::Lines;
}

}  // namespace

ProgressBar::ProgressBar(std::int64_t total_steps, std::FILE* out, Style style, std::string rate_unit)
    : total_(total_steps),
      out_(out),
      style_(resolve(style, out)),
      rate_unit_(std::move(rate_unit)),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

std::size_t ProgressBar::width() const {
  int columns = 0;
  winsize size{};
  if (::ioctl(fileno(out_), TIOCGWINSZ, &size) == 0) columns = size.ws_col;
  if (columns == 0)
    if (const char* env = std::getenv("COLUMNS")) columns = std::atoi(env);
  if (columns <= 0) columns = 160;
  return static_cast<std::size_t>(std::max(columns - 1, 20));
}

std::string ProgressBar::fit(const std::string& full, const std::string& compact) const {
  const std::size_t room = width();
  if (full.size() <= room) return full;
  // The numbers matter more than the bar: drop the decoration first, then cut.
  return compact.size() <= room ? compact : compact.substr(0, room);
}

void ProgressBar::update(std::int64_t steps_done, const OrderedLogs& logs, double samples_per_second) {
  if (advance(steps_done)) draw(logs, samples_per_second);
}

bool ProgressBar::advance(std::int64_t steps_done) {
  if (first_step_ < 0) first_step_ = steps_done - 1;  // a resumed epoch starts part-way
  steps_done_ = steps_done;
  switch (style_) {
    case Style::EpochOnly: return false;
    case Style::Bar:
      return std::chrono::steady_clock::now() - last_draw_ >= std::chrono::milliseconds(100) || steps_done >= total_;
    default: return steps_done >= next_plain_report_ && steps_done != total_;
  }
}

void ProgressBar::draw(const OrderedLogs& logs, double samples_per_second) {
  if (style_ == Style::EpochOnly) return;
  const std::int64_t steps_done = steps_done_;
  const auto now = std::chrono::steady_clock::now();  // after the values were read, as the caller's rate is
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const auto taken = static_cast<double>(std::max<std::int64_t>(steps_done - first_step_, 1));
  const double per_step = elapsed / taken;
  const double eta = per_step * static_cast<double>(total_ - steps_done);
  const int digits = static_cast<int>(std::to_string(total_).size());
  if (style_ == Style::Bar) {
    last_draw_ = now;
    const auto filled = total_ > 0 ? static_cast<int>(kBarWidth * steps_done / total_) : kBarWidth;
    std::string bar(static_cast<std::size_t>(filled), '=');
    if (filled < kBarWidth) bar += '>' + std::string(static_cast<std::size_t>(kBarWidth - filled - 1), '.');
    const std::string line = fmt::format("{:>{}}/{} [{}] - ETA: {} - {}{} - {:.0f} {}", steps_done, digits, total_, bar,
                                         format_duration(eta), format_step_time(per_step), format_logs(logs), samples_per_second, rate_unit_);
    const std::string compact = fmt::format("{}/{}{}", steps_done, total_, format_logs(logs));
    fmt::print(out_, "\r{}\x1b[K", fit(line, compact));
    std::fflush(out_);
    return;
  }
  next_plain_report_ = steps_done + std::max<std::int64_t>(1, total_ / 10);
  fmt::print(out_, "{:>{}}/{} - ETA: {} - {}{} - {:.0f} {}\n", steps_done, digits, total_, format_duration(eta),
             format_step_time(per_step), format_logs(logs), samples_per_second, rate_unit_);
  std::fflush(out_);
}

void ProgressBar::finish(const OrderedLogs& logs, double seconds, double training_seconds, double samples_per_second) {
  const int digits = static_cast<int>(std::to_string(total_).size());
  // An epoch that a stop or a step limit cut short ends where it stopped, its step time over the steps taken.
  const std::int64_t done = steps_done_ < 0 ? total_ : steps_done_;
  const auto taken = static_cast<double>(std::max<std::int64_t>(done - std::max<std::int64_t>(first_step_, 0), 1));
  const int filled = total_ > 0 ? static_cast<int>(kBarWidth * done / total_) : kBarWidth;
  const std::string bar =
      std::string(static_cast<std::size_t>(filled), '=') + std::string(static_cast<std::size_t>(kBarWidth - filled), '.');
  const std::string line = fmt::format("{:>{}}/{} [{}] - {} {}{} - {:.0f} {}", done, digits, total_, bar, format_duration(seconds),
                                       format_step_time(training_seconds / taken), format_logs(logs), samples_per_second, rate_unit_);
  // The epoch's line stays on the screen: on a narrow terminal it loses the bar, never a number.
  const std::string compact = fmt::format("{}/{} - {} {}{} - {:.0f} {}", done, total_, format_duration(seconds),
                                          format_step_time(training_seconds / taken), format_logs(logs), samples_per_second, rate_unit_);
  if (style_ == Style::Bar) fmt::print(out_, "\r{}\x1b[K\n", line.size() <= width() ? line : compact);
  else fmt::print(out_, "{}\n", line);
  std::fflush(out_);
}

}  // namespace cohort::train
