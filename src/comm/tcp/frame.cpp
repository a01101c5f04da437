#include "frame.hpp"

#include <fmt/format.h>

namespace cohort::comm::tcp {
HeaderBytes encode(const FrameHeader& header) {
  HeaderBytes out{};
  put_le<std::uint32_t>(out, 0, header.magic);
  put_le<std::uint16_t>(out, 4, header.version);
  put_le<std::uint16_t>(out, 6, static_cast<std::uint16_t>(header.type));
  put_le<std::uint64_t>(out, 8, header.tag);
  put_le<std::uint64_t>(out, 16, header.length);
  return out;
}

FrameHeader decode(const HeaderBytes& bytes) {
  return {get_le<std::uint32_t>(bytes, 0), get_le<std::uint16_t>(bytes, 4), static_cast<FrameType>(get_le<std::uint16_t>(bytes, 6)),
          get_le<std::uint64_t>(bytes, 8), get_le<std::uint64_t>(bytes, 16)};
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
    case FrameType::Refused:
    case FrameType::Accepted:
      break;
    case FrameType::Heartbeat:
    case FrameType::Abort:
    case FrameType::Bye:
    case FrameType::Stuck:
    case FrameType::Announce:
      // Their tag says all: a length would be bytes the reader never reads, so the next header would start inside them.
      if (header.length != 0)
        return fmt::format("a frame of type {} announcing {} bytes, though that type carries none",
                           static_cast<unsigned>(header.type), header.length);
      break;
    case FrameType::Failed:
      if (header.length > kMaxRefusalBytes)
        return fmt::format("a failure report of {} bytes, above the {} a reason may have", header.length, kMaxRefusalBytes);
      break;
    default:
      return fmt::format("unknown frame type {}", static_cast<unsigned>(header.type));
  }
  if (header.length > max_payload) return fmt::format("frame of {} bytes exceeds the limit of {}", header.length, max_payload);
  return std::nullopt;
}

}  // namespace cohort::comm::tcp
