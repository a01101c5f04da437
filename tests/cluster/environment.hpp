#pragma once
// A fixed environment for discovery tests: the variables given, nothing else.

#include <map>
#include <optional>
#include <string>

#include "cohort/cluster/discovery.hpp"

namespace cluster_test {

inline cohort::cluster::Environment environment_of(std::map<std::string, std::string> values) {
  return [values = std::move(values)](const std::string& name) -> std::optional<std::string> {
    const auto it = values.find(name);
    return it == values.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

}  // namespace cluster_test
