#pragma once
// Small text helpers shared by the tables cohort prints (model summaries, placement plans).

#include <cstdint>
#include <string>

namespace cohort {

// 1234567 -> "1,234,567", independent of the locale.
std::string with_thousands(std::int64_t value);
// 1572864 -> "1.50 MiB".
std::string mebibytes(double bytes);

}  // namespace cohort
