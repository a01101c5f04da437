#include "cohort/train/run_report.hpp"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fmt/format.h>
#include <fstream>
#include <set>

#include "cohort/core/check.hpp"
#include "cohort/core/error.hpp"
#include "cohort/train/strategy.hpp"
#include "cohort/train/trainer.hpp"
#include "svg_chart.hpp"

namespace cohort::train {
namespace {

std::vector<double> column(const std::vector<Logs>& epochs, const std::string& name) {
  std::vector<double> values;
  for (const Logs& logs : epochs) {
    const auto it = logs.find(name);
    values.push_back(it == logs.end() ? std::nan("") : it->second);
  }
  return values;
}

bool has(const std::vector<Logs>& epochs, const std::string& name) {
  for (const Logs& logs : epochs)
    if (logs.contains(name)) return true;
  return false;
}

std::string section(const std::string& heading, const std::string& body) {
  return fmt::format("<h2>{}</h2>\n{}\n", escape_html(heading), body);
}

std::string preformatted(const std::string& text) { return "<pre>" + escape_html(text) + "</pre>"; }

}  // namespace

RunReport::RunReport(RunReportOptions options) : options_(std::move(options)) {
  COHORT_CHECK(!options_.path.empty(), "RunReport needs a path");
}

void RunReport::on_train_begin(TrainingControl& control) {
  writing_ = control.is_chief();
  if (!writing_) return;
  if (std::filesystem::is_directory(options_.path))
    throw IoError(fmt::format("RunReport cannot write {}: it is a directory", options_.path.string()));
  strategy_ = &control.trainer().strategy();
  epochs_.clear();
  steps_.clear();
  finished_ = false;
  const Strategy& strategy = *strategy_;
  std::vector<std::string> names;
  for (int r = 0; r < strategy.replicas(); ++r) names.push_back(strategy.replica_name(r));
  processes_ = fmt::format("{}: {} training process{} ({})", strategy.name(), strategy.replicas(),
                           strategy.replicas() == 1 ? "" : "es", fmt::join(names, ", "));
  setup_ = strategy.setup_report();
  model_summary_ = control.model().summary();
  write();
}

void RunReport::on_epoch_begin(std::int64_t epoch, TrainingControl&) {
  if (epochs_.empty()) first_epoch_ = epoch;
  epoch_steps_ = 0;
}

void RunReport::on_batch_end(std::int64_t, const Logs&, TrainingControl&) { ++epoch_steps_; }

void RunReport::on_epoch_end(std::int64_t, const Logs& logs, TrainingControl&) {
  if (!writing_) return;
  epochs_.push_back(logs);
  steps_.push_back(epoch_steps_);
  write();
}

void RunReport::on_train_end(const Logs&) {
  if (!writing_) return;
  traffic_ = strategy_->final_report();
  finished_ = true;
  write();
}

std::string RunReport::page() const {
  std::string body;
  body += fmt::format("<p>{}</p>\n<p>{}</p>\n", escape_html(processes_),
                      finished_ ? fmt::format("{} epochs trained", epochs_.size())
                                : fmt::format("training: {} epochs so far", epochs_.size()));

  // Curves: every log that is not validation's or a time, beside its validation twin.
  std::string curves;
  std::set<std::string> drawn;
  for (const Logs& logs : epochs_)
    for (const auto& [name, value] : logs) {
      if (name.starts_with(kValidationPrefix) || drawn.contains(name) || name == "seconds" || name == "comm_seconds" ||
          name == "samples_per_second" || name == "learning_rate")
        continue;
      drawn.insert(name);
      std::vector<ChartSeries> series{{"training", column(epochs_, name)}};
      const std::string validation = std::string(kValidationPrefix) + name;
      if (has(epochs_, validation)) series.push_back({"validation", column(epochs_, validation)});
      curves += line_chart(name, series);
    }
  for (const Logs& logs : epochs_)
    for (const auto& [name, value] : logs)
      if (name.starts_with(kValidationPrefix) && !drawn.contains(name.substr(kValidationPrefix.size())) && !drawn.contains(name)) {
        drawn.insert(name);
        curves += line_chart(name, {{"validation", column(epochs_, name)}});
      }
  body += section("Curves", curves.empty() ? "<p>No epoch has ended yet.</p>" : curves);

  // Where the time went, per epoch: the communication the steps waited for, and the rest.
  if (has(epochs_, "seconds")) {
    const auto seconds = column(epochs_, "seconds"), communication = column(epochs_, "comm_seconds");
    std::vector<double> computing(seconds.size());
    for (std::size_t e = 0; e < seconds.size(); ++e)
      computing[e] = std::isfinite(communication[e]) ? seconds[e] - communication[e] : seconds[e];
    std::vector<ChartSeries> split{{"computing and data", computing}};
    if (has(epochs_, "comm_seconds")) split.push_back({"waiting for communication", communication});
    std::string table = "<table><tr><th>epoch</th><th>seconds</th><th>waiting for communication</th><th>steps</th><th>ms per step</th></tr>";
    for (std::size_t e = 0; e < seconds.size(); ++e) {
      const double per_step = steps_[e] > 0 ? 1000 * seconds[e] / static_cast<double>(steps_[e]) : 0;
      table += fmt::format("<tr><td>{}</td><td>{:.2f}</td><td>{}</td><td>{}</td><td>{:.1f}</td></tr>", first_epoch_ + static_cast<std::int64_t>(e) + 1,
                           seconds[e], std::isfinite(communication[e]) && seconds[e] > 0 ? fmt::format("{:.2f} s ({:.0f}%)", communication[e], 100 * communication[e] / seconds[e]) : "-",
                           steps_[e], per_step);
    }
    table += "</table>";
    body += section("Step time", stacked_bar_chart("seconds per epoch", split) + table);
  }

  // The schedule and the batch the steps took, as measured.
  std::string schedule;
  if (has(epochs_, "learning_rate")) schedule += line_chart("learning rate", {{"learning rate", column(epochs_, "learning_rate")}});
  if (has(epochs_, "samples_per_second")) schedule += line_chart("samples per second", {{"all processes", column(epochs_, "samples_per_second")}});
  if (!epochs_.empty() && steps_.back() > 0 && epochs_.back().contains("samples_per_second") && epochs_.back().contains("seconds")) {
    const double samples = epochs_.back().at("samples_per_second") * epochs_.back().at("seconds");
    schedule += fmt::format("<p>Effective global batch: {:.0f} samples per step on average ({:.0f} samples in {} steps in the last epoch, "
                            "every process and accumulated pass together).</p>",
                            samples / static_cast<double>(steps_.back()), samples, steps_.back());
  }
  if (!schedule.empty()) body += section("Learning rate and batch", schedule);

  if (!setup_.empty()) body += section("Placement", preformatted(setup_));
  if (!traffic_.empty()) body += section("Traffic", preformatted(traffic_));
  body += section("Model", preformatted(model_summary_));

  return fmt::format(
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{0}</title><style>"
      "body{{font-family:sans-serif;margin:2em;max-width:1100px}}svg.chart{{margin:4px;border:1px solid #ddd}}"
      "table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}pre{{background:#f6f6f6;padding:8px}}"
      "</style></head>\n<body><h1>{0}</h1>\n{1}</body></html>\n",
      escape_html(options_.title), body);
}

void RunReport::write() const {
  // Written beside and renamed over, so that a reader never sees half a page.
  const auto partial = std::filesystem::path(options_.path.string() + ".partial");
  {
    std::ofstream out(partial, std::ios::trunc);
    out << page();
    out.flush();
    if (!out) throw IoError(fmt::format("RunReport cannot write {}: {}", options_.path.string(), std::strerror(errno)));
  }
  std::error_code error;
  std::filesystem::rename(partial, options_.path, error);
  if (error) throw IoError(fmt::format("RunReport cannot write {}: {}", options_.path.string(), error.message()));
}

}  // namespace cohort::train
