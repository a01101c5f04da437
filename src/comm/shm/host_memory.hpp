#pragma once
// How much memory this host can still give shared-memory rings: each process reserves its mailbox at
// set-up, and a host whose ranks reserved more than it has would have the kernel kill some of them.
#include <cstdint>
#include <optional>
#include <string>

namespace cohort::comm::shm {

// The memory this process may still take: MemAvailable, or less where its cgroup (v2) limit leaves less.
// None where neither can be read.
std::optional<std::uint64_t> available_memory_bytes();

// Why a host's ranks should not reserve `host_bytes` in all when `available` bytes are free: more than
// half of them (the ranks need the rest). None when they may.
std::optional<std::string> reservation_refusal(std::uint64_t host_bytes, std::uint64_t available);

}  // namespace cohort::comm::shm
