#pragma once
// Logs: named metric values of a step or an epoch ("loss", "accuracy", "val_loss", ...), ordered by name.

#include <map>
#include <string>
#include <string_view>

namespace cohort::train {

using Logs = std::map<std::string, double>;

// What the names of validation's logs start with ("val_loss").
inline constexpr std::string_view kValidationPrefix = "val_";

}  // namespace cohort::train
