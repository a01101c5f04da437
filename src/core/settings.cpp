#include "cohort/core/settings.hpp"

#include <charconv>
#include <cstdlib>
#include <fmt/format.h>

#include "cohort/core/error.hpp"

namespace cohort {
namespace {

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
  count_setting("COHORT_RESTART", kRestartMeaning);
  count_setting("COHORT_CUDA_DEVICE", kCudaDeviceMeaning);
  for (const char* name : {"COHORT_HIERARCHICAL_ALLREDUCE", "COHORT_SHARED_MEMORY", "COHORT_TLS", "COHORT_ALLOW_TF32"})
    switch_setting(name);
  choice_setting("COHORT_PROGRESS", kProgressSpellings);
  choice_setting("COHORT_COMMUNICATOR", kCommunicatorSpellings);
  choice_setting("COHORT_GEMM", kGemmSpellings);
  choice_setting("COHORT_CPU_ISA", kCpuIsaSpellings);
  choice_setting("COHORT_BF16_KERNELS", kBf16KernelsSpellings);
}

}  // namespace cohort
