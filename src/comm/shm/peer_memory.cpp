#include "peer_memory.hpp"

#include <poll.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <climits>
#include <utility>
#include <vector>

namespace cohort::comm::shm {
namespace {

std::string reason_for(int code, bool writing) {
  switch (code) {
    case ESRCH: return "its process has ended";
    case EFAULT: return writing ? "not writable memory of its process" : "not readable memory of its process";
    case EPERM: return fmt::format("the kernel does not let this process {} that process's memory (another user's process, or "
                                   "kernel.yama.ptrace_scope above 0)", writing ? "write" : "read");
    case ENOSYS: return writing ? "this kernel has no cross-memory attach (process_vm_writev)"
                                : "this kernel has no cross-memory attach (process_vm_readv)";
    default: return std::strerror(code);
  }
}

}  // namespace

bool PeerAccessError::process_gone() const { return code == ESRCH; }

std::optional<PeerAccessError> read_peer_memory(pid_t pid, std::span<const PeerCopy> copies) {
  std::vector<iovec> local, remote;
  std::size_t next = 0, done_of_next = 0;  // where the reads stand: a short read may stop inside a copy
  const auto advance = [&](std::size_t bytes) {
    for (; next < copies.size(); ++next, done_of_next = 0) {
      const std::size_t taken = std::min(bytes, copies[next].into.size() - done_of_next);
      done_of_next += taken;
      bytes -= taken;
      if (done_of_next < copies[next].into.size()) break;
    }
  };
  advance(0);
  while (next < copies.size()) {
    local.clear();
    remote.clear();
    for (std::size_t c = next; c < copies.size() && local.size() < IOV_MAX; ++c) {
      const std::size_t skip = c == next ? done_of_next : 0;
      if (copies[c].into.size() == skip) continue;
      local.push_back({copies[c].into.data() + skip, copies[c].into.size() - skip});
      remote.push_back({reinterpret_cast<void*>(copies[c].address + skip), copies[c].into.size() - skip});
    }
    const ssize_t read = ::process_vm_readv(pid, local.data(), local.size(), remote.data(), remote.size(), 0);
    if (read < 0 && errno == EINTR) continue;
    // A short read stops at memory it cannot read; 0 bytes means the next byte is such.
    if (read <= 0) {
      const int code = read == 0 ? EFAULT : errno;
      return PeerAccessError{code, reason_for(code, false), next};
    }
    advance(static_cast<std::size_t>(read));
  }
  return std::nullopt;
}

std::optional<PeerAccessError> read_peer_memory(pid_t pid, std::uint64_t address, std::span<std::byte> out) {
  const PeerCopy copy{.address = address, .into = out};
  return read_peer_memory(pid, std::span(&copy, 1));
}

std::optional<PeerAccessError> write_peer_memory(pid_t pid, std::uint64_t address, std::span<const std::byte> bytes) {
  for (std::size_t done = 0; done < bytes.size();) {
    const iovec local{const_cast<std::byte*>(bytes.data() + done), bytes.size() - done};
    const iovec remote{reinterpret_cast<void*>(address + done), bytes.size() - done};
    const ssize_t written = ::process_vm_writev(pid, &local, 1, &remote, 1, 0);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {  // a short write stops at memory it cannot write
      const int code = written == 0 ? EFAULT : errno;
      return PeerAccessError{code, reason_for(code, true), 0};
    }
    done += static_cast<std::size_t>(written);
  }
  return std::nullopt;
}

std::optional<ProcessHandle> ProcessHandle::open(pid_t pid) {
  const long fd = ::syscall(SYS_pidfd_open, pid, 0);
  if (fd < 0) return std::nullopt;
  return ProcessHandle(static_cast<int>(fd));
}

ProcessHandle::ProcessHandle(ProcessHandle&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

ProcessHandle& ProcessHandle::operator=(ProcessHandle&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

ProcessHandle::~ProcessHandle() {
  if (fd_ >= 0) ::close(fd_);
}

bool ProcessHandle::ended() const {
  pollfd entry{.fd = fd_, .events = POLLIN, .revents = 0};  // a pidfd becomes readable when its process ends
  return ::poll(&entry, 1, 0) != 0;
}

}  // namespace cohort::comm::shm
