#pragma once
// Small text helpers shared by the tables cohort prints (model summaries, placement plans).

#include <cstddef>
#include <cstdint>
#include <string>

namespace cohort {

// 1234567 -> "1,234,567", independent of the locale.
std::string with_thousands(std::int64_t value);
// 1572864 -> "1.50 MiB".
std::string mebibytes(double bytes);
// A buffer's size as configured: 2097152 -> "2 MiB", 262144 -> "256 KiB" (whole KiB below a whole MiB).
std::string binary_size(std::size_t bytes);

}  // namespace cohort
