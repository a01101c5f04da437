#pragma once
// CRC-32C (Castagnoli), the checksum of parameter-server payloads: the SSE4.2 crc32 instruction where the
// processor has it, three streams at once so that the instruction's latency is hidden (about 3x one stream),
// a table otherwise; both give the same value.
//
//   std::uint32_t crc = crc32c_of(bytes, n);               // whole
//   crc = crc32c_extend(crc32c_extend(0, a, na), b, nb);   // == crc32c_of(a then b)
//   crc = crc32c_copy(crc, out, in, n);                     // copies, and extends crc over them, in one pass

#include <cstddef>
#include <cstdint>

namespace cohort {

// The CRC of the bytes that `crc` covers followed by these; crc32c_extend(0, ...) == crc32c_of(...).
std::uint32_t crc32c_extend(std::uint32_t crc, const void* data, std::size_t size);

inline std::uint32_t crc32c_of(const void* data, std::size_t size) { return crc32c_extend(0, data, size); }

// Copies `size` bytes from `in` to `out` (which must not overlap) and extends `crc` over them, reading `in`
// once from memory: each block is checksummed, then copied while it is in cache.
std::uint32_t crc32c_copy(std::uint32_t crc, void* out, const void* in, std::size_t size);

// The table-driven computation alone, whatever the processor (to test the fast one against).
std::uint32_t crc32c_portable(std::uint32_t crc, const void* data, std::size_t size);

}  // namespace cohort
