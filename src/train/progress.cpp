#include "cohort/train/progress.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <string>

namespace cohort::train {
namespace {

constexpr int kBarWidth = 30;

std::string format_duration(double seconds) {
  const auto s = static_cast<long>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60);
  if (s >= 60) return fmt::format("{}:{:02}", s / 60, s % 60);
  return fmt::format("{}s", s);
}

std::string format_logs(const Logs& logs) {
  std::string out;
  for (const auto& [name, value] : logs) out += fmt::format(" - {}: {:.4f}", name, value);
  return out;
}

}  // namespace

ProgressBar::ProgressBar(std::int64_t total_steps, std::FILE* out, int interactive)
    : total_(total_steps),
      out_(out),
      interactive_(interactive < 0 ? isatty(fileno(out)) != 0 : interactive != 0),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

void ProgressBar::update(std::int64_t steps_done, const Logs& logs, double images_per_second) {
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double eta = steps_done > 0 ? elapsed / static_cast<double>(steps_done) * static_cast<double>(total_ - steps_done) : 0;
  const int digits = static_cast<int>(std::to_string(total_).size());
  if (interactive_) {
    if (now - last_draw_ < std::chrono::milliseconds(100) && steps_done < total_) return;
    last_draw_ = now;
    const auto filled = total_ > 0 ? static_cast<int>(kBarWidth * steps_done / total_) : kBarWidth;
    std::string bar(static_cast<std::size_t>(filled), '=');
    if (filled < kBarWidth) bar += '>' + std::string(static_cast<std::size_t>(kBarWidth - filled - 1), '.');
    fmt::print(out_, "\r{:>{}}/{} [{}] - ETA: {}{} - {:.0f} img/s\x1b[K", steps_done, digits, total_, bar,
               format_duration(eta), format_logs(logs), images_per_second);
    std::fflush(out_);
    return;
  }
  if (steps_done < next_plain_report_ || steps_done == total_) return;
  next_plain_report_ = steps_done + std::max<std::int64_t>(1, total_ / 10);
  fmt::print(out_, "{:>{}}/{} - ETA: {}{} - {:.0f} img/s\n", steps_done, digits, total_, format_duration(eta),
             format_logs(logs), images_per_second);
  std::fflush(out_);
}

void ProgressBar::finish(const Logs& logs, double seconds, double images_per_second) {
  const int digits = static_cast<int>(std::to_string(total_).size());
  const std::string line = fmt::format("{:>{}}/{} [{}] - {}{} - {:.0f} img/s", total_, digits, total_,
                                       std::string(kBarWidth, '='), format_duration(seconds), format_logs(logs),
                                       images_per_second);
  if (interactive_) fmt::print(out_, "\r{}\x1b[K\n", line);
  else fmt::print(out_, "{}\n", line);
  std::fflush(out_);
}

}  // namespace cohort::train
