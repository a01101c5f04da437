#include "cohort/core/format.hpp"

#include <fmt/format.h>

namespace cohort {

std::string with_thousands(std::int64_t value) {
  const std::string digits = std::to_string(value);
  const std::size_t sign = digits.front() == '-' ? 1 : 0;
  std::string grouped = digits.substr(0, sign);
  for (std::size_t i = sign; i < digits.size(); ++i) {
    if (i > sign && (digits.size() - i) % 3 == 0) grouped += ',';
    grouped += digits[i];
  }
  return grouped;
}

std::string mebibytes(double bytes) { return fmt::format("{:.2f} MiB", bytes / (1024.0 * 1024.0)); }

std::string binary_size(std::size_t bytes) {
  return bytes % (std::size_t{1} << 20) == 0 ? fmt::format("{} MiB", bytes >> 20) : fmt::format("{} KiB", bytes >> 10);
}

}  // namespace cohort
