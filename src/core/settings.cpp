#include "cohort/core/settings.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <fmt/format.h>
#include <unistd.h>
#include <vector>

#include "cohort/core/error.hpp"

namespace cohort {
namespace {

// Every COHORT_* variable that cohort, its programs, its tests and its benchmarks read. Any other name in the
// environment is a misspelling of one of them, which would otherwise be ignored.
constexpr std::string_view kSettingNames[] = {
    // the cluster and its deadlines (cluster/)
    "COHORT_ROLE", "COHORT_HOST", "COHORT_MASTER_ADDR", "COHORT_MASTER_PORT", "COHORT_WORKER_PORT", "COHORT_PS_PORT",
    "COHORT_NUM_PS", "COHORT_CONNECT_TIMEOUT", "COHORT_PEER_TIMEOUT", "COHORT_HEARTBEAT_INTERVAL", "COHORT_TIMEOUT",
    // the transports and their security
    "COHORT_SECRET", "COHORT_SECRET_FILE", "COHORT_TLS", "COHORT_TLS_CA", "COHORT_TLS_CERT", "COHORT_TLS_KEY",
    "COHORT_TRANSPORT", "COHORT_SHARED_MEMORY", "COHORT_SINGLE_COPY", "COHORT_HIERARCHICAL_ALLREDUCE", "COHORT_COMMUNICATOR",
    // kernels and devices
    "COHORT_GEMM", "COHORT_CPU_ISA", "COHORT_BF16_KERNELS", "COHORT_ALLOW_TF32", "COHORT_DETERMINISTIC", "COHORT_CUDA_DEVICE",
    "COHORT_EMULATED_MEMORY",
    // runs under cohort-launch
    "COHORT_RESTART", "COHORT_TIMELINE_PARTS", "COHORT_PROGRESS",
    // the test suite and the benchmarks
    "COHORT_TEST_DEVICE", "COHORT_FUZZ_SEEDS", "COHORT_GLOO_STORE", "COHORT_LATENCY_OPTIMAL_BELOW",
    "COHORT_HALVING_DOUBLING_BELOW", "COHORT_DIRECT_FROM"};

// Levenshtein distance, for the suggestion in a misspelling's refusal.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

void check_setting_names() {
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string_view variable(*entry);
    const std::string_view name = variable.substr(0, variable.find('='));
    if (!name.starts_with("COHORT_") || std::ranges::find(kSettingNames, name) != std::end(kSettingNames)) continue;
    const auto nearest = std::ranges::min(kSettingNames, {}, [&](std::string_view known) { return edit_distance(name, known); });
    if (edit_distance(name, nearest) <= 3)
      throw InvalidArgument(fmt::format("{} is not a cohort setting: did you mean {}? Unset it", name, nearest));
    throw InvalidArgument(fmt::format("{} is not a cohort setting (they are {}); unset it", name, fmt::join(kSettingNames, ", ")));
  }
}

std::optional<std::string> value_of(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

}  // namespace

std::optional<bool> switch_setting(const char* name) {
  const auto value = value_of(name);
  if (!value) return std::nullopt;
  if (*value != "0" && *value != "1")
    throw InvalidArgument(fmt::format("{}='{}': use 1 (on) or 0 (off), or unset it", name, *value));
  return *value == "1";
}

std::optional<std::string> choice_setting(const char* name, std::span<const std::string_view> choices) {
  const auto value = value_of(name);
  if (!value) return std::nullopt;
  for (std::string_view choice : choices)
    if (*value == choice) return value;
  throw InvalidArgument(fmt::format("{}='{}': use {}, or unset it", name, *value, fmt::join(choices, ", ")));
}

std::optional<std::int64_t> count_setting(const char* name, std::string_view meaning) {
  const auto value = value_of(name);
  if (!value) return std::nullopt;
  std::int64_t count = -1;
  const auto [end, error] = std::from_chars(value->data(), value->data() + value->size(), count);
  if (error != std::errc() || end != value->data() + value->size() || count < 0)
    throw InvalidArgument(fmt::format("{}='{}': use a whole number, 0 or more ({}), or unset it", name, *value, meaning));
  return count;
}

void check_settings() {
  check_setting_names();
  // Two sources of one secret are refused even where no secret is needed, so that the mistake shows at once.
  if (value_of("COHORT_SECRET") && value_of("COHORT_SECRET_FILE"))
    throw InvalidArgument("COHORT_SECRET and COHORT_SECRET_FILE are both set: set one of them, so that every process "
                          "surely uses the same secret");
  count_setting("COHORT_RESTART", kRestartMeaning);
  count_setting("COHORT_CUDA_DEVICE", kCudaDeviceMeaning);
  count_setting("COHORT_EMULATED_MEMORY", kEmulatedMemoryMeaning);
  for (const char* name : {"COHORT_HIERARCHICAL_ALLREDUCE", "COHORT_SHARED_MEMORY", "COHORT_SINGLE_COPY", "COHORT_TLS", "COHORT_ALLOW_TF32",
                           "COHORT_DETERMINISTIC"})
    switch_setting(name);
  choice_setting("COHORT_PROGRESS", kProgressSpellings);
  choice_setting("COHORT_COMMUNICATOR", kCommunicatorSpellings);
  choice_setting("COHORT_GEMM", kGemmSpellings);
  choice_setting("COHORT_CPU_ISA", kCpuIsaSpellings);
  choice_setting("COHORT_BF16_KERNELS", kBf16KernelsSpellings);
}

}  // namespace cohort
