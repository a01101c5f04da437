#pragma once
// Logs: named metric values of a step or an epoch ("loss", "accuracy", "val_loss", ...), ordered by name.

#include <map>
#include <string>

namespace cohort::train {

using Logs = std::map<std::string, double>;

}  // namespace cohort::train
