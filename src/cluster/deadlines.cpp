// Connection settings from the environment (deadlines, encryption), so that an operator can adapt them to
// a network without rebuilding the program.
#include <charconv>
#include <cmath>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cohort/cluster/cluster.hpp"
#include "cohort/comm/transports.hpp"
#include "cohort/core/error.hpp"

namespace cohort::cluster {
namespace {

constexpr double kLongestSeconds = 24 * 3600;

std::chrono::milliseconds parse_duration(const std::string& text, const char* name) {
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  const std::string unit(end, text.data() + text.size());
  const double seconds_per_unit = unit.empty() || unit == "s" ? 1 : unit == "ms" ? 1e-3 : unit == "m" ? 60 : unit == "h" ? 3600 : 0;
  const double seconds = value * seconds_per_unit;
  if (text.empty() || error != std::errc() || seconds_per_unit == 0 || !std::isfinite(seconds) || seconds < 1e-3 ||
      seconds > kLongestSeconds)
    throw InvalidArgument(fmt::format("{}='{}' is not a duration between 1ms and 24h (such as 90, 90s, 500ms, 2m, 1h)",
                                      name, text));
  return std::chrono::milliseconds(std::llround(seconds * 1000));
}

void override_from(const Environment& environment, const char* name, std::chrono::milliseconds& deadline) {
  if (const auto text = environment(name)) deadline = parse_duration(*text, name);
}

}  // namespace

ConnectOptions with_environment_settings(ConnectOptions options, const Environment& environment) {
  override_from(environment, "COHORT_CONNECT_TIMEOUT", options.connect_timeout);
  override_from(environment, "COHORT_TIMEOUT", options.timeout);
  override_from(environment, "COHORT_HEARTBEAT_INTERVAL", options.heartbeat_interval);
  override_from(environment, "COHORT_PEER_TIMEOUT", options.peer_timeout);
  if (options.peer_timeout <= options.heartbeat_interval)
    throw InvalidArgument(fmt::format("the peer timeout ({} ms, COHORT_PEER_TIMEOUT) must be longer than the heartbeat "
                                      "interval ({} ms, COHORT_HEARTBEAT_INTERVAL)",
                                      options.peer_timeout.count(), options.heartbeat_interval.count()));
  if (const auto tls = environment("COHORT_TLS")) {
    if (*tls != "0" && *tls != "1") throw InvalidArgument(fmt::format("COHORT_TLS='{}': use 1 (encrypt) or 0", *tls));
    options.tls.enabled = *tls == "1";
  }
  if (const auto shared = environment("COHORT_SHARED_MEMORY")) {
    if (*shared != "0" && *shared != "1")
      throw InvalidArgument(fmt::format("COHORT_SHARED_MEMORY='{}': use 1 (ranks on one host share memory) or 0 (TCP only)", *shared));
    options.transport = *shared == "1" ? "shared-memory" : "tcp";
  }
  if (const auto transport = environment("COHORT_TRANSPORT")) {
    if (transport->empty())
      throw InvalidArgument(fmt::format("COHORT_TRANSPORT is set but empty: name a transport ({})", fmt::join(comm::transport_names(), ", ")));
    if (const auto shared = environment("COHORT_SHARED_MEMORY"); shared && *transport != options.transport)
      throw InvalidArgument(fmt::format("COHORT_TRANSPORT={} and COHORT_SHARED_MEMORY={} disagree: set one of them",
                                        *transport, *shared));
    options.transport = *transport;
  }
  if (const auto single = environment("COHORT_SINGLE_COPY")) {
    if (*single != "0" && *single != "1")
      throw InvalidArgument(fmt::format("COHORT_SINGLE_COPY='{}': use 1 (large same-host messages read from the sender's "
                                        "memory) or 0 (copied through the shared-memory rings)", *single));
    options.single_copy = *single == "1";
  }
  int files = 0;
  for (auto [name, file] : {std::pair{"COHORT_TLS_CERT", &options.tls.certificate}, std::pair{"COHORT_TLS_KEY", &options.tls.private_key},
                            std::pair{"COHORT_TLS_CA", &options.tls.ca}}) {
    if (const auto value = environment(name)) *file = *value;
    files += file->empty() ? 0 : 1;
  }
  if (files != 0 && files != 3)
    throw InvalidArgument("COHORT_TLS_CERT, COHORT_TLS_KEY and COHORT_TLS_CA go together: set all three, or none to key TLS "
                          "from the shared secret");
  if (files == 3 && !options.tls.enabled)
    throw InvalidArgument("COHORT_TLS_CERT, COHORT_TLS_KEY and COHORT_TLS_CA are set but COHORT_TLS is not 1");
  return options;
}

}  // namespace cohort::cluster
