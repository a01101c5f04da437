#include "cohort/train/history.hpp"

#include <fmt/format.h>

#include <limits>
#include <set>

#include "core/sealed_file.hpp"

namespace cohort::train {

std::vector<double> History::metric(const std::string& name) const {
  std::vector<double> values;
  for (const auto& logs : epochs) {
    const auto it = logs.find(name);
    values.push_back(it == logs.end() ? std::numeric_limits<double>::quiet_NaN() : it->second);
  }
  return values;
}

std::string History::to_csv() const {
  std::set<std::string> columns;
  for (const auto& logs : epochs)
    for (const auto& [name, value] : logs) columns.insert(name);
  std::string out = "epoch";
  for (const auto& c : columns) out += "," + c;
  out += "\n";
  for (std::size_t e = 0; e < epochs.size(); ++e) {
    out += std::to_string(e + 1);
    for (const auto& c : columns) {
      const auto it = epochs[e].find(c);
      out += it == epochs[e].end() ? "," : fmt::format(",{:.6g}", it->second);
    }
    out += "\n";
  }
  return out;
}

void History::write_csv(const std::filesystem::path& path) const { write_file_atomically(path, to_csv()); }

}  // namespace cohort::train
