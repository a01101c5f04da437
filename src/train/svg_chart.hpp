#pragma once
// Inline SVG charts for the run report: lines over epochs (one polyline per series, a circle per point)
// and stacked bars, with axes labelled at their ends. No script, so that any browser or a file viewer
// shows them as written.

#include <string>
#include <vector>

namespace cohort::train {

struct ChartSeries {
  std::string name;
  std::vector<double> values;  // one per epoch; non-finite values are left out
};

// Lines of every series against epochs 1..n, sharing the y axis.
std::string line_chart(const std::string& title, const std::vector<ChartSeries>& series);
// A bar per epoch, the series stacked from the bottom (e.g. compute, then exposed communication).
std::string stacked_bar_chart(const std::string& title, const std::vector<ChartSeries>& series);

// `text` with &, <, > and quotes escaped for HTML.
std::string escape_html(const std::string& text);

}  // namespace cohort::train
