#pragma once
// History: the per-epoch metrics fit() returns, as Keras' History.history, writable as CSV.
//
//   auto history = trainer.fit(train, options);
//   history.write_csv("history.csv");   // epoch,accuracy,loss,...

#include <filesystem>
#include <string>
#include <vector>

#include "cohort/train/logs.hpp"

namespace cohort::train {

struct History {
  std::vector<Logs> epochs;

  // The values of one metric, epoch by epoch (NaN where an epoch lacks it).
  std::vector<double> metric(const std::string& name) const;
  std::string to_csv() const;
  // Written atomically: a reader never sees a half-written file.
  void write_csv(const std::filesystem::path& path) const;
};

}  // namespace cohort::train
