#pragma once
// Cross-memory attach (Linux process_vm_readv and process_vm_writev): copies bytes straight out of, or
// into, a same-host peer's address space, the one copy a large shared-memory message takes instead of two
// through a ring. The kernel allows it for processes of the same user that may trace each other
// (kernel.yama.ptrace_scope 0, or a parent reaching its child).
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "cohort/comm/transport.hpp"

namespace cohort::comm::shm {

struct PeerAccessError {
  int code = 0;  // errno
  std::string reason;
  std::size_t copy = 0;  // the index of the copy that failed
  bool process_gone() const;
};

// Reads each copy's bytes out of process `pid`, up to IOV_MAX copies per system call; the error says why not.
std::optional<PeerAccessError> read_peer_memory(pid_t pid, std::span<const PeerCopy> copies);
std::optional<PeerAccessError> read_peer_memory(pid_t pid, std::uint64_t address, std::span<std::byte> out);
// Writes `bytes` into process `pid` at `address`, resuming after short writes.
std::optional<PeerAccessError> write_peer_memory(pid_t pid, std::uint64_t address, std::span<const std::byte> bytes);

// A handle on one process (a pidfd): it tells whether that process has ended even once its pid is reused,
// so that a read whose process ended meanwhile is known to be unsound.
class ProcessHandle {
 public:
  // None where the kernel has no pidfd (before Linux 5.3) or the process is gone.
  static std::optional<ProcessHandle> open(pid_t pid);
  ProcessHandle(ProcessHandle&& other) noexcept;
  ProcessHandle& operator=(ProcessHandle&& other) noexcept;
  ~ProcessHandle();
  bool ended() const;

 private:
  explicit ProcessHandle(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace cohort::comm::shm
