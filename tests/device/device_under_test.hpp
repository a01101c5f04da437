#pragma once
// The device the parity tests run on, chosen by main() from COHORT_TEST_DEVICE.
#include "cohort/core/device.hpp"

namespace device_test {
cohort::Device device_under_test();
}
