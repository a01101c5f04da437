// The device parity tests: COHORT_TEST_DEVICE (cuda unless set) names the device compared with the CPU.
// Where that device cannot run here the binary prints why and exits 77, which ctest reports as skipped.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cohort/core/error.hpp"
#include "cohort/tensor/devices.hpp"
#include "device/device_under_test.hpp"

namespace {
cohort::Device chosen = cohort::Device::CUDA;
}

cohort::Device device_test::device_under_test() { return chosen; }

int main(int argc, char** argv) {
  const char* name = std::getenv("COHORT_TEST_DEVICE");
  const std::string wanted = name == nullptr || *name == '\0' ? "cuda" : name;
  try {
    chosen = cohort::choose_device(wanted);
  } catch (const cohort::Error& e) {
    std::printf("SKIPPED: device '%s' is not available here: %s\n", wanted.c_str(), e.what());
    return 77;
  }
  std::printf("device under test: %s\n", wanted.c_str());
  return Catch::Session().run(argc, argv);
}
