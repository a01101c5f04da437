#include "cohort/core/format.hpp"

namespace cohort {

std::string with_thousands(std::int64_t value) {
  std::string digits = std::to_string(value);
  const int first = digits.front() == '-' ? 1 : 0;
  for (int i = static_cast<int>(digits.size()) - 3; i > first; i -= 3) digits.insert(static_cast<std::size_t>(i), ",");
  return digits;
}

}  // namespace cohort
