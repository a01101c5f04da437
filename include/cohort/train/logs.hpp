#pragma once
// Logs: named metric values of a step or an epoch ("loss", "accuracy", "val_loss", ...), ordered by name.

#include <cstddef>
#include <map>
#include <string>
#include <string_view>

namespace cohort::train {

using Logs = std::map<std::string, double>;

// What the names of validation's logs start with ("val_loss").
inline constexpr std::string_view kValidationPrefix = "val_";

// A parameter server's epoch log, "ps<k>_<quantity>": "ps0_megabytes", "ps1_latency_ms".
inline std::string server_log(std::size_t server, std::string_view quantity) {
  return "ps" + std::to_string(server) + "_" + std::string(quantity);
}
inline bool is_server_log(std::string_view name) {
  return name.starts_with("ps") && name.size() > 2 && name[2] >= '0' && name[2] <= '9';
}

}  // namespace cohort::train
