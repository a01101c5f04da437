#include "svg_chart.hpp"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <limits>

namespace cohort::train {
namespace {

constexpr double kWidth = 520, kHeight = 260, kLeft = 64, kRight = 16, kTop = 28, kBottom = 36;
constexpr const char* kColours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"};

const char* colour(std::size_t i) { return kColours[i % std::size(kColours)]; }

struct Range {
  double low = std::numeric_limits<double>::infinity(), high = -std::numeric_limits<double>::infinity();
  void add(double v) {
    if (!std::isfinite(v)) return;
    low = std::min(low, v);
    high = std::max(high, v);
  }
  // A range with room: a flat series gets one around it, an empty one [0, 1].
  void settle() {
    if (low > high) low = 0, high = 1;
    if (high - low < 1e-12) {
      const double pad = std::max(std::abs(high) * 0.05, 1e-6);
      low -= pad;
      high += pad;
    }
  }
};

std::size_t epochs_of(const std::vector<ChartSeries>& series) {
  std::size_t n = 0;
  for (const auto& s : series) n = std::max(n, s.values.size());
  return n;
}

std::string frame(const std::string& title, const Range& y, std::size_t epochs, const std::string& body,
                  const std::vector<ChartSeries>& series) {
  std::string legend;
  double x = kLeft;
  for (std::size_t i = 0; i < series.size(); ++i) {
    legend += fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="10" height="10" fill="{}"/><text x="{:.1f}" y="{:.1f}">{}</text>)",
                          x, kHeight - 12, colour(i), x + 14, kHeight - 3, escape_html(series[i].name));
    x += 24 + 7.0 * static_cast<double>(series[i].name.size());
  }
  return fmt::format(
      R"(<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11">)"
      R"(<text x="{l}" y="16" font-size="13" font-weight="bold">{title}</text>)"
      R"(<line x1="{l}" y1="{b}" x2="{r}" y2="{b}" stroke="#444"/><line x1="{l}" y1="{t}" x2="{l}" y2="{b}" stroke="#444"/>)"
      R"(<text x="{lt}" y="{t4}" text-anchor="end">{high:.4g}</text><text x="{lt}" y="{b}" text-anchor="end">{low:.4g}</text>)"
      R"(<text x="{l}" y="{bx}">epoch 1</text><text x="{r}" y="{bx}" text-anchor="end">epoch {epochs}</text>)"
      "{body}{legend}</svg>\n",
      fmt::arg("w", kWidth), fmt::arg("h", kHeight), fmt::arg("l", kLeft), fmt::arg("r", kWidth - kRight),
      fmt::arg("t", kTop), fmt::arg("b", kHeight - kBottom), fmt::arg("lt", kLeft - 4), fmt::arg("t4", kTop + 4),
      fmt::arg("bx", kHeight - kBottom + 12), fmt::arg("title", escape_html(title)), fmt::arg("high", y.high),
      fmt::arg("low", y.low), fmt::arg("epochs", std::max<std::size_t>(epochs, 1)), fmt::arg("body", body),
      fmt::arg("legend", legend));
}

double x_of(std::size_t epoch, std::size_t epochs) {
  const double span = kWidth - kLeft - kRight;
  return epochs <= 1 ? kLeft + span / 2 : kLeft + span * static_cast<double>(epoch) / static_cast<double>(epochs - 1);
}

double y_of(double value, const Range& y) {
  return kHeight - kBottom - (kHeight - kBottom - kTop) * (value - y.low) / (y.high - y.low);
}

}  // namespace

std::string escape_html(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string line_chart(const std::string& title, const std::vector<ChartSeries>& series) {
  Range y;
  for (const auto& s : series)
    for (double v : s.values) y.add(v);
  y.settle();
  const std::size_t epochs = epochs_of(series);
  std::string body;
  for (std::size_t i = 0; i < series.size(); ++i) {
    std::string points, dots;
    std::size_t drawn = 0;
    for (std::size_t e = 0; e < series[i].values.size(); ++e) {
      const double v = series[i].values[e];
      if (!std::isfinite(v)) continue;
      const double px = x_of(e, epochs), py = y_of(v, y);
      points += fmt::format("{}{:.1f},{:.1f}", drawn == 0 ? "" : " ", px, py);
      dots += fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="3" fill="{}"><title>epoch {}: {:.6g}</title></circle>)", px, py,
                          colour(i), e + 1, v);
      ++drawn;
    }
    body += fmt::format(R"(<polyline class="series" data-series="{}" data-points="{}" fill="none" stroke="{}" stroke-width="2" points="{}"/>{})",
                        escape_html(series[i].name), drawn, colour(i), points, dots);
  }
  return frame(title, y, epochs, body, series);
}

std::string stacked_bar_chart(const std::string& title, const std::vector<ChartSeries>& series) {
  const std::size_t epochs = epochs_of(series);
  Range y;
  y.add(0);
  for (std::size_t e = 0; e < epochs; ++e) {
    double total = 0;
    for (const auto& s : series)
      if (e < s.values.size() && std::isfinite(s.values[e])) total += std::max(0.0, s.values[e]);
    y.add(total);
  }
  y.settle();
  const double slot = (kWidth - kLeft - kRight) / static_cast<double>(std::max<std::size_t>(epochs, 1));
  std::string body;
  for (std::size_t e = 0; e < epochs; ++e) {
    double base = 0;
    for (std::size_t i = 0; i < series.size(); ++i) {
      const double v = e < series[i].values.size() && std::isfinite(series[i].values[e]) ? std::max(0.0, series[i].values[e]) : 0;
      const double top = y_of(base + v, y), bottom = y_of(base, y);
      body += fmt::format(R"(<rect class="bar" x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="{}"><title>epoch {}, {}: {:.4g}</title></rect>)",
                          kLeft + slot * static_cast<double>(e) + slot * 0.15, top, slot * 0.7, bottom - top, colour(i), e + 1,
                          escape_html(series[i].name), v);
      base += v;
    }
  }
  return frame(title, y, epochs, body, series);
}

}  // namespace cohort::train
