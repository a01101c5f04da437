// The device parity tests: COHORT_TEST_DEVICE (cuda unless set) names the device compared with the CPU.
// Where that device cannot run here the binary prints why and exits 77, which ctest reports as skipped
// (`ctest -V` shows the reason); a name that is no device, or the CPU itself, is a usage error (exit 2).
// Catch2's listing and help options work everywhere.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "cohort/core/error.hpp"
#include "cohort/tensor/devices.hpp"
#include "device/device_under_test.hpp"

namespace {
cohort::Device chosen = cohort::Device::CUDA;

bool only_lists_or_helps(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.starts_with("--list") || arg == "-l" || arg == "-t" || arg == "--help" || arg == "-h" || arg == "-?" ||
        arg == "--version")
      return true;
  }
  return false;
}
}  // namespace

cohort::Device device_test::device_under_test() { return chosen; }

int main(int argc, char** argv) {
  if (only_lists_or_helps(argc, argv)) return Catch::Session().run(argc, argv);
  const char* name = std::getenv("COHORT_TEST_DEVICE");
  const std::string wanted = name == nullptr || *name == '\0' ? "cuda" : name;
  const std::optional<cohort::Device> device = wanted == "auto" ? std::nullopt : cohort::parse_device(wanted);
  if (wanted != "auto" && !device) {
    std::fprintf(stderr, "COHORT_TEST_DEVICE='%s' is not a device: use cuda, emulated or auto\n", wanted.c_str());
    return 2;
  }
  // The comparisons are with the CPU's float32: strict FP32 on the GPU too.
  cohort::allow_tf32(false);
  try {
    chosen = cohort::choose_device(wanted);
  } catch (const cohort::Error& e) {
    std::printf("SKIPPED: device '%s' is not available here: %s\n", wanted.c_str(), e.what());
    return 77;
  }
  if (chosen == cohort::Device::CPU && wanted == "auto") {
    std::printf("SKIPPED: COHORT_TEST_DEVICE=auto found no GPU: %s\n",
                cohort::device_unavailable_reason(cohort::Device::CUDA).c_str());
    return 77;
  }
  if (chosen == cohort::Device::CPU) {
    std::fprintf(stderr, "COHORT_TEST_DEVICE=cpu: the CPU is the reference the tests compare with\n");
    return 2;
  }
  std::printf("device under test: %s\n", std::string(cohort::device_name(chosen)).c_str());
  return Catch::Session().run(argc, argv);
}
