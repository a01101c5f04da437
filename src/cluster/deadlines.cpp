// Deadlines from the environment, so that an operator can lengthen them for a slow network without
// rebuilding the program.
#include <charconv>
#include <cmath>
#include <fmt/format.h>

#include "cohort/cluster/cluster.hpp"
#include "cohort/core/error.hpp"

namespace cohort::cluster {
namespace {

constexpr double kLongestSeconds = 24 * 3600;

std::chrono::milliseconds parse_duration(const std::string& text, const char* name) {
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  const std::string unit(end, text.data() + text.size());
  const double seconds_per_unit = unit.empty() || unit == "s" ? 1 : unit == "ms" ? 1e-3 : unit == "m" ? 60 : 0;
  const double seconds = value * seconds_per_unit;
  if (text.empty() || error != std::errc() || seconds_per_unit == 0 || !std::isfinite(seconds) || seconds < 1e-3 ||
      seconds > kLongestSeconds)
    throw InvalidArgument(fmt::format("{}='{}' is not a duration between 1ms and 24h (such as 90, 90s, 500ms, 2m)",
                                      name, text));
  return std::chrono::milliseconds(std::llround(seconds * 1000));
}

void override_from(const Environment& environment, const char* name, std::chrono::milliseconds& deadline) {
  if (const auto text = environment(name)) deadline = parse_duration(*text, name);
}

}  // namespace

ConnectOptions with_environment_deadlines(ConnectOptions options, const Environment& environment) {
  override_from(environment, "COHORT_CONNECT_TIMEOUT", options.connect_timeout);
  override_from(environment, "COHORT_TIMEOUT", options.timeout);
  override_from(environment, "COHORT_HEARTBEAT_INTERVAL", options.heartbeat_interval);
  override_from(environment, "COHORT_PEER_TIMEOUT", options.peer_timeout);
  if (options.peer_timeout <= options.heartbeat_interval)
    throw InvalidArgument(fmt::format("the peer timeout ({} ms, COHORT_PEER_TIMEOUT) must be longer than the heartbeat "
                                      "interval ({} ms, COHORT_HEARTBEAT_INTERVAL)",
                                      options.peer_timeout.count(), options.heartbeat_interval.count()));
  return options;
}

}  // namespace cohort::cluster
