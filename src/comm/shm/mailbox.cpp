#include "mailbox.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <limits>
#include <random>
#include <regex>

#include "cohort/core/check.hpp"
#include "cohort/core/error.hpp"

namespace cohort::comm::shm {
namespace {

constexpr std::uint64_t kMagic = 0x636F686F72746D62ull;  // "cohortmb"
constexpr std::size_t kPage = 4096;

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

Nonce random_nonce() {
  std::random_device device;
  Nonce nonce{};
  for (std::size_t i = 0; i < nonce.size(); i += 4) {
    const std::uint32_t word = device();
    std::memcpy(nonce.data() + i, &word, 4);
  }
  return nonce;
}

// How a peer opens a memory file of process `pid`: its descriptor in /proc, which the kernel lets only
// processes of the same user (that may trace it) open.
std::string descriptor_path(pid_t pid, int fd) { return fmt::format("/proc/{}/fd/{}", pid, fd); }

bool is_descriptor_path(const std::string& name) {
  static const std::regex kPath(R"(/proc/[1-9][0-9]{0,9}/fd/[0-9]{1,10})");
  return std::regex_match(name, kPath);
}

long futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t value, const timespec* timeout) {
  // Not FUTEX_PRIVATE_FLAG: the word lives in memory shared between processes.
  return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, value, timeout, nullptr, 0);
}

}  // namespace

std::size_t counters_offset() { return round_up(sizeof(MailboxHeader), 64); }

std::size_t rings_offset(std::uint32_t slots) { return round_up(counters_offset() + slots * sizeof(RingCounters), kPage); }

std::uint64_t Ring::free_bytes() {
  const std::uint64_t taken = counters_->tail.load(std::memory_order_acquire);
  if (taken > written_ || written_ - taken > capacity_) broken_ = true;
  return broken_ ? 0 : capacity_ - (written_ - taken);
}

std::uint64_t Ring::readable_bytes() {
  const std::uint64_t published = counters_->head.load(std::memory_order_acquire);
  if (published < read_ || published - read_ > capacity_) broken_ = true;
  return broken_ ? 0 : published - read_;
}

void Ring::write(std::span<const std::byte> data) {
  const std::uint64_t at = written_ % capacity_;
  const std::size_t first = std::min<std::size_t>(data.size(), capacity_ - at);
  std::memcpy(bytes_ + at, data.data(), first);
  std::memcpy(bytes_, data.data() + first, data.size() - first);
  written_ += data.size();
}

void Ring::read(std::span<std::byte> out) {
  const std::uint64_t at = read_ % capacity_;
  const std::size_t first = std::min<std::size_t>(out.size(), capacity_ - at);
  std::memcpy(out.data(), bytes_ + at, first);
  std::memcpy(out.data() + first, bytes_, out.size() - first);
  read_ += out.size();
}

std::size_t Mailbox::bytes_for(std::uint32_t slots, std::uint64_t ring_bytes) {
  const std::size_t header = rings_offset(slots);
  if (slots != 0 && ring_bytes > (std::numeric_limits<off_t>::max() - header) / slots)
    throw IoError(fmt::format("{} rings of {} bytes do not fit in one segment", slots, ring_bytes));
  return header + slots * ring_bytes;
}

Mailbox Mailbox::create(std::uint32_t slots, std::uint64_t ring_bytes) {
  Mailbox box;
  box.size_ = bytes_for(slots, ring_bytes);
  box.slots_ = slots;
  box.ring_bytes_ = ring_bytes;
  // A memory file rather than a name in /dev/shm: it vanishes with its last user, and its seals keep
  // anybody, this process included, from shrinking it under the peers that map it (who would die of SIGBUS).
  const std::string label = fmt::format("cohort-{}", ::getpid());  // as /proc/PID/maps shows it
  box.fd_ = ::memfd_create(label.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (box.fd_ < 0) throw IoError(fmt::format("cannot create shared memory {}: {}", label, std::strerror(errno)));
  box.name_ = descriptor_path(::getpid(), box.fd_);
  // The header and counters are reserved now, each ring when its pair first talks (reserve_ring), so that a
  // full memory is an error then and not a SIGBUS on a later write.
  if (::ftruncate(box.fd_, static_cast<off_t>(box.size_)) != 0)
    throw IoError(fmt::format("cannot size shared memory {}: {}", label, std::strerror(errno)));
  const int reserved = ::posix_fallocate(box.fd_, 0, static_cast<off_t>(rings_offset(slots)));
  if (reserved != 0)
    throw IoError(fmt::format("cannot reserve shared memory: {}", std::strerror(reserved)));
  if (::fcntl(box.fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    throw IoError(fmt::format("cannot seal shared memory {}: {}", label, std::strerror(errno)));
  box.base_ = ::mmap(nullptr, box.size_, PROT_READ | PROT_WRITE, MAP_SHARED, box.fd_, 0);
  if (box.base_ == MAP_FAILED) {
    box.base_ = nullptr;
    throw IoError(fmt::format("cannot map shared memory {}: {}", box.name_, std::strerror(errno)));
  }
  new (box.base_) MailboxHeader{.magic = kMagic, .nonce = random_nonce(), .slots = slots, .ring_bytes = ring_bytes};
  for (std::uint32_t slot = 0; slot < slots; ++slot)
    new (static_cast<std::byte*>(box.base_) + counters_offset() + slot * sizeof(RingCounters)) RingCounters{};
  return box;
}

std::optional<std::string> Mailbox::reserve_ring(std::uint32_t slot) {
  if (fd_ < 0) return "its shared memory is closed";
  const int reserved = ::posix_fallocate(fd_, static_cast<off_t>(rings_offset(slots_) + slot * ring_bytes_), static_cast<off_t>(ring_bytes_));
  if (reserved != 0) return fmt::format("cannot reserve {} KiB of shared memory: {}", ring_bytes_ >> 10, std::strerror(reserved));
  return std::nullopt;
}

Mailbox Mailbox::open(const std::string& name, const Nonce& nonce, std::uint32_t slots, std::uint64_t ring_bytes) {
  if (!is_descriptor_path(name))
    throw IoError(fmt::format("it offered shared memory named '{}', not one of cohort's", name));
  Mailbox box;
  box.name_ = name;
  box.size_ = bytes_for(slots, ring_bytes);
  box.slots_ = slots;
  box.ring_bytes_ = ring_bytes;
  const int fd = ::open(name.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) throw IoError(fmt::format("cannot open its shared memory {}: {}", name, std::strerror(errno)));
  struct stat status {};
  if (::fstat(fd, &status) != 0 || static_cast<std::size_t>(status.st_size) != box.size_) {
    ::close(fd);
    throw IoError(fmt::format("its shared memory {} is not the size offered", name));
  }
  // Sealed for good against shrinking, or a peer could cut the memory away under this process.
  constexpr int kRequiredSeals = F_SEAL_SHRINK | F_SEAL_SEAL;
  if (const int seals = ::fcntl(fd, F_GET_SEALS); seals < 0 || (seals & kRequiredSeals) != kRequiredSeals) {
    ::close(fd);
    throw IoError(fmt::format("its shared memory {} is not sealed against shrinking", name));
  }
  box.base_ = ::mmap(nullptr, box.size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (box.base_ == MAP_FAILED) {
    box.base_ = nullptr;
    throw IoError(fmt::format("cannot map its shared memory {}: {}", name, std::strerror(errno)));
  }
  const MailboxHeader& header = box.header();
  if (header.magic != kMagic || header.nonce != nonce || header.slots != slots || header.ring_bytes != ring_bytes)
    throw IoError(fmt::format("the shared memory {} is not the one offered (another host's process of that id?)", name));
  return box;
}

Mailbox::Mailbox(Mailbox&& other) noexcept { *this = std::move(other); }

Mailbox& Mailbox::operator=(Mailbox&& other) noexcept {
  std::swap(name_, other.name_);
  std::swap(base_, other.base_);
  std::swap(size_, other.size_);
  std::swap(slots_, other.slots_);
  std::swap(ring_bytes_, other.ring_bytes_);
  std::swap(fd_, other.fd_);
  return *this;
}

Mailbox::~Mailbox() {
  unlink();
  if (base_ != nullptr) ::munmap(base_, size_);
}

void Mailbox::unlink() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Ring Mailbox::ring(std::uint32_t slot) const {
  COHORT_CHECK(slot < slots_, "slot {} of a segment of {}", slot, slots_);
  auto* base = static_cast<std::byte*>(base_);
  return {reinterpret_cast<RingCounters*>(base + counters_offset() + slot * sizeof(RingCounters)),
          base + rings_offset(slots_) + slot * ring_bytes_, ring_bytes_};
}

void Mailbox::ring_bell() const {
  if (header().sleeping.load(std::memory_order_seq_cst) != 0) wake_owner();
}

void Mailbox::wake_owner() const {
  MailboxHeader& h = header();
  h.bell.fetch_add(1, std::memory_order_seq_cst);
  futex(&h.bell, FUTEX_WAKE, 1, nullptr);
}

void Mailbox::wait_for_bell(std::uint32_t seen, std::chrono::microseconds timeout) const {
  const timespec limit{.tv_sec = static_cast<time_t>(timeout.count() / 1'000'000),
                       .tv_nsec = static_cast<long>(timeout.count() % 1'000'000) * 1'000};
  futex(&header().bell, FUTEX_WAIT, seen, &limit);  // returns at once when the bell has moved
}

}  // namespace cohort::comm::shm
