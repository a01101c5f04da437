#include "frame.hpp"

#include <fmt/format.h>

namespace cohort::comm::tcp {
namespace {

template <typename T>
void put(HeaderBytes& out, std::size_t at, T value) {
  for (std::size_t i = 0; i < sizeof(T); ++i) out[at + i] = static_cast<std::byte>((static_cast<std::uint64_t>(value) >> (8 * i)) & 0xff);
}

template <typename T>
T get(const HeaderBytes& in, std::size_t at) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) value |= static_cast<std::uint64_t>(in[at + i]) << (8 * i);
  return static_cast<T>(value);
}

}  // namespace

HeaderBytes encode(const FrameHeader& header) {
  HeaderBytes out{};
  put<std::uint32_t>(out, 0, header.magic);
  put<std::uint16_t>(out, 4, header.version);
  put<std::uint16_t>(out, 6, static_cast<std::uint16_t>(header.type));
  put<std::uint64_t>(out, 8, header.tag);
  put<std::uint64_t>(out, 16, header.length);
  return out;
}

FrameHeader decode(const HeaderBytes& bytes) {
  return {get<std::uint32_t>(bytes, 0), get<std::uint16_t>(bytes, 4), static_cast<FrameType>(get<std::uint16_t>(bytes, 6)),
          get<std::uint64_t>(bytes, 8), get<std::uint64_t>(bytes, 16)};
}

std::optional<std::string> check(const FrameHeader& header, std::uint64_t max_payload) {
  if (header.magic != kMagic) return fmt::format("bad magic 0x{:08x}, not a cohort peer", header.magic);
  if (header.version != kProtocolVersion)
    return fmt::format("protocol version {}, this build speaks {}", header.version, kProtocolVersion);
  switch (header.type) {
    case FrameType::Hello:
    case FrameType::Challenge:
    case FrameType::Response:
    case FrameType::Data:
    case FrameType::Heartbeat:
    case FrameType::Abort:
    case FrameType::Bye:
    case FrameType::Refused:
      break;
    default:
      return fmt::format("unknown frame type {}", static_cast<unsigned>(header.type));
  }
  if (header.length > max_payload) return fmt::format("frame of {} bytes exceeds the limit of {}", header.length, max_payload);
  return std::nullopt;
}

}  // namespace cohort::comm::tcp
