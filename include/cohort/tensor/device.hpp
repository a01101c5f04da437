#pragma once
// Where a tensor's storage lives. Ops dispatch on it; layer code never does.

#include <string_view>

namespace cohort {

enum class Device { CPU, CUDA };

constexpr std::string_view device_name(Device device) { return device == Device::CPU ? "cpu" : "cuda"; }

}  // namespace cohort
