#include "cohort/comm/allreduce_timings.hpp"

#include <algorithm>
#include <bit>
#include <limits>

#include "cohort/core/check.hpp"

namespace cohort::comm {

int AllreduceTimings::band_of(std::size_t bytes) {
  COHORT_CHECK(timed(bytes), "allreduce timings: {} bytes is not a timed size", bytes);
  return std::bit_width(bytes) - 1;
}

AllreduceTimings::Next AllreduceTimings::next(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  const Band& band = bands_[band_of(bytes)];
  if (band.kept) return {*band.kept, false};
  return {static_cast<Algorithm>(band.trials % kCandidates), true};
}

bool AllreduceTimings::record(std::size_t bytes, std::chrono::steady_clock::time_point began, bool ran) {
  const float seconds = std::chrono::duration<float>(clock_() - began).count();
  const float per_byte = ran ? seconds / static_cast<float>(bytes) : std::numeric_limits<float>::infinity();
  std::lock_guard lock(mutex_);
  Band& band = bands_[band_of(bytes)];
  COHORT_CHECK(!band.kept && band.trials < kTrials, "allreduce timings: a trial recorded for {} bytes after the last", bytes);
  float& best = band.best_seconds_per_byte[static_cast<std::size_t>(band.trials % kCandidates)];
  if (best < 0 || per_byte < best) best = per_byte;
  return ++band.trials == kTrials;
}

std::array<float, AllreduceTimings::kCandidates> AllreduceTimings::best_seconds_per_byte(std::size_t bytes) const {
  std::lock_guard lock(mutex_);
  const auto band = bands_.find(band_of(bytes));
  COHORT_CHECK(band != bands_.end() && band->second.trials == kTrials, "allreduce timings: {} bytes has trials to run", bytes);
  return band->second.best_seconds_per_byte;
}

AllreduceTimings::Algorithm AllreduceTimings::settle(std::size_t bytes, std::array<float, kCandidates> summed_seconds_per_byte) {
  std::lock_guard lock(mutex_);
  Band& band = bands_[band_of(bytes)];
  const auto fastest = std::ranges::min_element(summed_seconds_per_byte);  // the first of equals
  band.kept = static_cast<Algorithm>(fastest - summed_seconds_per_byte.begin());
  return *band.kept;
}

std::optional<AllreduceTimings::Algorithm> AllreduceTimings::settled(std::size_t bytes) const {
  std::lock_guard lock(mutex_);
  const auto band = bands_.find(band_of(bytes));
  return band == bands_.end() ? std::nullopt : band->second.kept;
}

std::optional<bool> AllreduceTimings::short_of_cores() const {
  std::lock_guard lock(mutex_);
  return short_of_cores_;
}

bool AllreduceTimings::keep_short_of_cores(bool short_of_cores) {
  std::lock_guard lock(mutex_);
  short_of_cores_ = short_of_cores;
  return short_of_cores;
}

}  // namespace cohort::comm
