#pragma once
// CRC-32C (Castagnoli), the checksum of parameter-server payloads: through Intel's ISA-L where the build
// found it (crc32c_isal.cpp), else the SSE4.2 crc32 instruction where the processor has it, else a table
// (crc32c_sse42.cpp); all give the same value.
//
//   std::uint32_t crc = crc32c_of(bytes, n);               // whole
//   crc = crc32c_extend(crc32c_extend(0, a, na), b, nb);   // == crc32c_of(a then b)
//   crc = crc32c_copy(crc, out, in, n);                     // copies, and extends crc over them, in one pass

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace cohort {

inline constexpr std::uint32_t kCrc32cPolynomial = 0x82F63B78;  // Castagnoli's, reflected

// The CRC of the bytes that `crc` covers followed by these; crc32c_extend(0, ...) == crc32c_of(...).
std::uint32_t crc32c_extend(std::uint32_t crc, const void* data, std::size_t size);

inline std::uint32_t crc32c_of(const void* data, std::size_t size) { return crc32c_extend(0, data, size); }

// Copies `size` bytes from `in` to `out` (which must not overlap) and extends `crc` over them, reading `in`
// once from memory: each block is checksummed, then copied while it is in cache.
std::uint32_t crc32c_copy(std::uint32_t crc, void* out, const void* in, std::size_t size);

// The table-driven computation alone, whatever the processor (to test the fast ones against).
std::uint32_t crc32c_portable(std::uint32_t crc, const void* data, std::size_t size);

// The SSE4.2 crc32 instruction's computation, or the table's where the processor lacks it: crc32c_extend()
// where the build has no ISA-L, and compiled in every build so that its tests run everywhere.
std::uint32_t crc32c_instruction(std::uint32_t crc, const void* data, std::size_t size);
std::string_view crc32c_instruction_engine();

// What computes crc32c_extend() in this build on this processor, in words.
std::string_view crc32c_engine();

}  // namespace cohort
