#include "peer_memory.hpp"

#include <poll.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <utility>

namespace cohort::comm::shm {
namespace {

std::string reason_for(int code) {
  switch (code) {
    case ESRCH: return "its process has ended";
    case EFAULT: return "the address it gave is not readable memory of its process";
    case EPERM: return "the kernel does not let this process read that process's memory (another user's process, or "
                       "kernel.yama.ptrace_scope above 0)";
    case ENOSYS: return "this kernel has no cross-memory attach (process_vm_readv)";
    default: return std::strerror(code);
  }
}

}  // namespace

bool PeerReadError::process_gone() const { return code == ESRCH; }

std::optional<PeerReadError> read_peer_memory(pid_t pid, std::uint64_t address, std::span<std::byte> out) {
  std::size_t done = 0;
  while (done < out.size()) {
    const iovec local{out.data() + done, out.size() - done};
    const iovec remote{reinterpret_cast<void*>(address + done), out.size() - done};
    const ssize_t read = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (read < 0 && errno == EINTR) continue;
    // A short read stops at memory it cannot read; 0 bytes means the next byte is such.
    if (read <= 0) {
      const int code = read == 0 ? EFAULT : errno;
      return PeerReadError{code, reason_for(code)};
    }
    done += static_cast<std::size_t>(read);
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
