#pragma once
// The wire format of the TCP transport. Every frame starts with a fixed 24-byte header, little-endian:
//   magic u32 "COHT" | protocol version u16 | frame type u16 | tag u64 | payload length u64
// followed by `length` payload bytes.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace cohort::comm::tcp {

inline constexpr std::uint32_t kMagic = 0x54484F43;  // "COHT"
inline constexpr std::uint16_t kProtocolVersion = 9;  // 9: connections on demand (Crossed; Failed names the rank)
inline constexpr std::size_t kHeaderBytes = 24;
inline constexpr std::size_t kNonceBytes = 32;
inline constexpr std::size_t kMacBytes = 32;

enum class FrameType : std::uint16_t {
  Hello = 1,      // client: tag = client rank; payload = handshake.hpp's Hello
  Challenge = 2,  // server: tag = 0 (no rank before the secret is proven); payload = nonce
  Response = 3,   // client: payload = proof of the secret
  Data = 10,      // tag = user tag; payload = message
  Heartbeat = 11,  // tag = how many collectives the sender has started (Transport::report_progress)
  Abort = 12,     // tag = the rank whose loss the sender observed
  Bye = 13,       // the sender shuts down cleanly
  Refused = 14,   // server, instead of a challenge or an acceptance: payload = why (text); the dialer's configuration is wrong
  Accepted = 15,  // server, after a correct response: payload = proof of the secret; data follows
  Stuck = 16,     // tag = the rank the sender found stuck (alive, but it never started a collective)
  Failed = 17,    // tag = the rank that ends; payload = why (text, at most kMaxRefusalBytes)
  Announce = 18,  // tag = the largest data frame the sender may send from now on, above kAlwaysExpectedBytes
  Crossed = 19,   // server, instead of an acceptance: both ranks dialed each other, and the lower one's dial is kept
};

// The data tag of the token that set-up passes around the ring (connections on demand).
inline constexpr std::uint64_t kSetUpTag = 0x5345545550544F4Bull;  // "SETUPTOK"

// The longest reason a Refused frame may carry.
inline constexpr std::size_t kMaxRefusalBytes = 512;

struct FrameHeader {
  std::uint32_t magic = kMagic;
  std::uint16_t version = kProtocolVersion;
  FrameType type = FrameType::Data;
  std::uint64_t tag = 0;
  std::uint64_t length = 0;
};

using HeaderBytes = std::array<std::byte, kHeaderBytes>;

// The little-endian integer fields of the wire's fixed layouts (frame headers, hellos).
template <typename T>
void put_le(std::span<std::byte> out, std::size_t at, T value) {
  for (std::size_t i = 0; i < sizeof(T); ++i) out[at + i] = static_cast<std::byte>((static_cast<std::uint64_t>(value) >> (8 * i)) & 0xff);
}

template <typename T>
T get_le(std::span<const std::byte> in, std::size_t at) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) value |= static_cast<std::uint64_t>(in[at + i]) << (8 * i);
  return static_cast<T>(value);
}

HeaderBytes encode(const FrameHeader& header);
FrameHeader decode(const HeaderBytes& bytes);
// Why a received header is unacceptable, or nothing when it is fine.
std::optional<std::string> check(const FrameHeader& header, std::uint64_t max_payload);
// Whether a connection's first bytes are a TLS handshake record (a TLS client) rather than a cohort header.
inline bool looks_like_tls(const HeaderBytes& bytes) { return bytes[0] == std::byte{0x16} && bytes[1] == std::byte{0x03}; }

}  // namespace cohort::comm::tcp
