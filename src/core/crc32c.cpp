#include "core/crc32c.hpp"

#include <algorithm>
#include <array>
#include <cstring>

namespace cohort {
namespace {

constexpr std::array<std::uint32_t, 256> make_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? kCrc32cPolynomial : 0);
    table[i] = crc;
  }
  return table;
}

constexpr auto kTable = make_table();

}  // namespace

std::uint32_t crc32c_portable(std::uint32_t crc, const void* data, std::size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc ^= 0xFFFFFFFFu;
  while (size-- > 0) crc = (crc >> 8) ^ kTable[(crc ^ *p++) & 0xFF];
  return crc ^ 0xFFFFFFFFu;
}

std::uint32_t crc32c_copy(std::uint32_t crc, void* out, const void* in, std::size_t size) {
  // A block small enough to stay in the first-level caches between the checksum's read and the copy's.
  constexpr std::size_t kBlock = 24 << 10;
  auto* to = static_cast<unsigned char*>(out);
  const auto* from = static_cast<const unsigned char*>(in);
  for (std::size_t done = 0; done < size;) {
    const std::size_t n = std::min(kBlock, size - done);
    crc = crc32c_extend(crc, from + done, n);
    std::memcpy(to + done, from + done, n);
    done += n;
  }
  return crc;
}

}  // namespace cohort
