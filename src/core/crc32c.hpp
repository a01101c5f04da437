#pragma once
// CRC-32C (Castagnoli), the checksum of parameter-server payloads: the SSE4.2 crc32 instruction where the
// processor has it (about 4x zlib's CRC-32 on the same core), a table otherwise; both give the same value.

#include <cstddef>
#include <cstdint>

namespace cohort {

std::uint32_t crc32c_of(const void* data, std::size_t size);

}  // namespace cohort
