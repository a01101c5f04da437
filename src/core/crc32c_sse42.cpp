// CRC-32C through the SSE4.2 crc32 instruction, three streams at once so that its latency is hidden (about
// 3x one stream), where the processor has it; the table otherwise. What a build without ISA-L computes with.
#include <array>
#include <cstring>

#include "core/crc32c.hpp"

#if defined(__x86_64__)
#include <nmmintrin.h>

namespace cohort {
namespace {

// Three independent streams of kLong (then kShort) bytes each, joined by shifting the earlier streams' CRCs
// over the later streams' lengths: a shift by n zero bytes is a linear map over GF(2), applied through
// four byte-indexed tables.
constexpr std::size_t kLong = 8192;
constexpr std::size_t kShort = 256;

using Matrix = std::array<std::uint32_t, 32>;  // column n: the image of bit n

constexpr std::uint32_t times(const Matrix& matrix, std::uint32_t vector) {
  std::uint32_t sum = 0;
  for (int n = 0; vector != 0; ++n, vector >>= 1)
    if (vector & 1) sum ^= matrix[static_cast<std::size_t>(n)];
  return sum;
}

constexpr Matrix squared(const Matrix& matrix) {
  Matrix square{};
  for (std::size_t n = 0; n < 32; ++n) square[n] = times(matrix, matrix[n]);
  return square;
}

using ShiftTables = std::array<std::array<std::uint32_t, 256>, 4>;

// The tables that move a CRC over `bytes` zero bytes (a power of two).
constexpr ShiftTables shift_tables(std::size_t bytes) {
  Matrix shift{};  // over one zero bit
  shift[0] = kCrc32cPolynomial;
  for (std::size_t n = 1; n < 32; ++n) shift[n] = 1u << (n - 1);
  for (std::size_t bits = 1; bits < 8 * bytes; bits *= 2) shift = squared(shift);
  ShiftTables tables{};
  for (std::uint32_t n = 0; n < 256; ++n)
    for (std::size_t byte = 0; byte < 4; ++byte) tables[byte][n] = times(shift, n << (8 * byte));
  return tables;
}

constexpr ShiftTables kShiftLong = shift_tables(kLong);
constexpr ShiftTables kShiftShort = shift_tables(kShort);

inline std::uint64_t shifted(const ShiftTables& tables, std::uint64_t crc) {
  return tables[0][crc & 0xff] ^ tables[1][(crc >> 8) & 0xff] ^ tables[2][(crc >> 16) & 0xff] ^ tables[3][(crc >> 24) & 0xff];
}

inline std::uint64_t word_at(const unsigned char* p) {
  std::uint64_t word;
  std::memcpy(&word, p, 8);
  return word;
}

template <std::size_t kStream>
__attribute__((target("sse4.2"))) inline std::uint64_t three_streams(std::uint64_t crc0, const unsigned char*& p, std::size_t& n,
                                                                     const ShiftTables& shift) {
  while (n >= 3 * kStream) {
    std::uint64_t crc1 = 0, crc2 = 0;
    for (const unsigned char* end = p + kStream; p < end; p += 8) {
      crc0 = _mm_crc32_u64(crc0, word_at(p));
      crc1 = _mm_crc32_u64(crc1, word_at(p + kStream));
      crc2 = _mm_crc32_u64(crc2, word_at(p + 2 * kStream));
    }
    crc0 = shifted(shift, crc0) ^ crc1;
    crc0 = shifted(shift, crc0) ^ crc2;
    p += 2 * kStream;
    n -= 3 * kStream;
  }
  return crc0;
}

__attribute__((target("sse4.2"))) std::uint32_t crc32c_sse42(std::uint32_t crc, const unsigned char* p, std::size_t n) {
  std::uint64_t crc0 = crc ^ 0xFFFFFFFFu;
  crc0 = three_streams<kLong>(crc0, p, n, kShiftLong);
  crc0 = three_streams<kShort>(crc0, p, n, kShiftShort);
  for (; n >= 8; p += 8, n -= 8) crc0 = _mm_crc32_u64(crc0, word_at(p));
  auto crc32 = static_cast<std::uint32_t>(crc0);
  while (n-- > 0) crc32 = _mm_crc32_u8(crc32, *p++);
  return crc32 ^ 0xFFFFFFFFu;
}

}  // namespace
}  // namespace cohort
#endif

namespace cohort {

std::uint32_t crc32c_instruction(std::uint32_t crc, const void* data, std::size_t size) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("sse4.2")) return crc32c_sse42(crc, static_cast<const unsigned char*>(data), size);
#endif
  return crc32c_portable(crc, data, size);
}

std::string_view crc32c_instruction_engine() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("sse4.2")) return "the SSE4.2 crc32 instruction, three streams";
#endif
  return "a table";
}

}  // namespace cohort
