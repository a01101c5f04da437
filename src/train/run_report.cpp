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

// Times and per-server loads have charts of their own; every other log is a curve.
bool is_curve(const std::string& name) {
  return !name.ends_with("seconds") && name != "samples_per_second" && name != "learning_rate" && !is_server_log(name);
}

// What each parameter server logged of `quantity` per epoch, as series "ps 0", "ps 1", ...
std::vector<ChartSeries> server_series(const std::vector<Logs>& epochs, std::string_view quantity) {
  std::vector<ChartSeries> series;
  for (std::size_t k = 0; has(epochs, server_log(k, quantity)); ++k)
    series.push_back({fmt::format("ps {}", k), column(epochs, server_log(k, quantity))});
  return series;
}

std::string seconds_cell(double part, double whole) {
  return std::isfinite(part) && whole > 0 ? fmt::format("{:.2f} s ({:.0f}%)", part, 100 * part / whole) : "-";
}

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
      if (name.starts_with(kValidationPrefix) || drawn.contains(name) || !is_curve(name)) continue;
      drawn.insert(name);
      std::vector<ChartSeries> series{{"training", column(epochs_, name)}};
      const std::string validation = std::string(kValidationPrefix) + name;
      if (has(epochs_, validation)) series.push_back({"validation", column(epochs_, validation)});
      curves += line_chart(name, series);
    }
  for (const Logs& logs : epochs_)
    for (const auto& [name, value] : logs)
      if (name.starts_with(kValidationPrefix) && !drawn.contains(name.substr(kValidationPrefix.size())) && !drawn.contains(name) &&
          is_curve(name)) {
        drawn.insert(name);
        curves += line_chart(name, {{"validation", column(epochs_, name)}});
      }
  body += section("Curves", curves.empty() ? "<p>No epoch has ended yet.</p>" : curves);

  // Where the time went, per epoch: waiting for the input pipeline, for communication that backward did
  // not hide, validation, and the rest (computing).
  if (has(epochs_, "seconds")) {
    const auto seconds = column(epochs_, "seconds");
    const std::vector<std::pair<std::string, std::string>> waits{
        {"data_seconds", "waiting for data"}, {"comm_seconds", "waiting for communication"}, {"validation_seconds", "validation"}};
    std::vector<double> computing = seconds;
    std::vector<ChartSeries> parts;
    for (const auto& [name, label] : waits) {
      if (!has(epochs_, name)) continue;
      parts.push_back({label, column(epochs_, name)});
      for (std::size_t e = 0; e < seconds.size(); ++e)
        if (std::isfinite(parts.back().values[e])) computing[e] -= parts.back().values[e];
    }
    parts.insert(parts.begin(), ChartSeries{"computing", computing});
    std::string table = "<table><tr><th>epoch</th><th>seconds</th>";
    for (const ChartSeries& part : parts) table += fmt::format("<th>{}</th>", part.name);
    table += "<th>steps</th><th>training ms per step</th></tr>";
    const auto validation = column(epochs_, "validation_seconds");
    for (std::size_t e = 0; e < seconds.size(); ++e) {
      const double training = std::isfinite(validation[e]) ? seconds[e] - validation[e] : seconds[e];
      const double per_step = steps_[e] > 0 ? 1000 * training / static_cast<double>(steps_[e]) : 0;
      table += fmt::format("<tr><td>{}</td><td>{:.2f}</td>", first_epoch_ + static_cast<std::int64_t>(e) + 1, seconds[e]);
      for (const ChartSeries& part : parts) table += fmt::format("<td>{}</td>", seconds_cell(part.values[e], seconds[e]));
      table += fmt::format("<td>{}</td><td>{:.1f}</td></tr>", steps_[e], per_step);
    }
    table += "</table>";
    body += section("Step time", stacked_bar_chart("seconds per epoch", parts) + table);
  }

  // Each parameter server's load per epoch, as the servers counted it.
  if (const auto megabytes = server_series(epochs_, "megabytes"); !megabytes.empty())
    body += section("Parameter servers per epoch", line_chart("megabytes in and out", megabytes) +
                                                       line_chart("mean request latency (ms)", server_series(epochs_, "latency_ms")));

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
