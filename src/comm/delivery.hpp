#pragma once
// How a transport hands a message to the receive that matched it: the same size check and the same error
// from every transport, as transport.hpp promises.
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

// What an operation still pending when its transport is destroyed fails with.
inline std::exception_ptr shut_down_error() { return std::make_exception_ptr(IoError("the transport was shut down")); }

// Copies `bytes` into `out` and completes `work`, or fails it when the sizes differ.
inline void hand_over(const std::string& from, Tag tag, std::span<const std::byte> bytes, std::span<std::byte> out, Work& work) {
  if (out.size() != bytes.size()) return work.fail(size_mismatch(from, tag, bytes.size(), out.size()));
  if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  work.complete();
}

}  // namespace cohort::comm
