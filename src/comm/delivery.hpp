#pragma once
// How a transport hands a message to the receive that matched it: the same size check and the same error
// from every transport, as transport.hpp promises.
#include <algorithm>
#include <cstring>
#include <fmt/format.h>
#include <span>
#include <string>

#include "cohort/comm/transport.hpp"
#include "cohort/core/error.hpp"

namespace cohort::comm {

inline std::exception_ptr size_mismatch(const std::string& from, Tag tag, std::size_t bytes, std::size_t expected) {
  return std::make_exception_ptr(
      ProtocolError(fmt::format("message from {} with tag {} has {} bytes, the receive expects {}", from, tag, bytes, expected)));
}

// How a group broke, which decides what its failed operations throw, alike on every transport: a lost
// member IoError, bytes that break the protocol ProtocolError, a member found stuck TimeoutError.
enum class Breakage { Lost, Protocol, Stuck };

// A fresh exception per failed operation: waiters on other threads rethrow them.
inline std::exception_ptr broken_group_error(Breakage breakage, const std::string& why) {
  switch (breakage) {
    case Breakage::Protocol: return std::make_exception_ptr(ProtocolError(why));
    case Breakage::Stuck: return std::make_exception_ptr(TimeoutError(why));
    case Breakage::Lost: break;
  }
  return std::make_exception_ptr(IoError(why));
}

// The largest frame a transport buffers while no receive awaits it, once the run said how large its messages
// get (Transport::expect_messages_up_to).
inline std::uint64_t expected_message_limit(std::uint64_t bytes, std::uint64_t max_frame_bytes) {
  return std::min(std::max(bytes, kAlwaysExpectedBytes), max_frame_bytes);
}

// What an operation still pending when its transport is destroyed fails with.
inline std::exception_ptr shut_down_error() { return std::make_exception_ptr(IoError("the transport was shut down")); }

// Copies `bytes`, which came from `peer` of `transport`, into `out` and completes `work`, or fails it when
// the sizes differ.
inline void hand_over(const Transport& transport, int peer, Tag tag, std::span<const std::byte> bytes, std::span<std::byte> out,
                      Work& work) {
  if (out.size() != bytes.size()) return work.fail(size_mismatch(transport.describe(peer), tag, bytes.size(), out.size()));
  if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  work.complete();
}

}  // namespace cohort::comm
