#include "core/crc32c.hpp"

namespace cohort {

std::uint32_t crc32c_extend(std::uint32_t crc, const void* data, std::size_t size) { return crc32c_instruction(crc, data, size); }

std::string_view crc32c_engine() { return crc32c_instruction_engine(); }

}  // namespace cohort
