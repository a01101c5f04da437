#pragma once
// Mailbox: one process's shared-memory segment for incoming messages: a ring per same-host peer, each
// written by that peer alone and read by this process alone, and one bell that wakes this process.
//
// Layout: a header page (magic, nonce, slot count, ring size, the bell), then per slot a cache-line pair
// of counters (head: bytes written, tail: bytes read; both only grow), then the rings' bytes.
//
// Waking without losing a wake-up: a sleeper announces itself (`sleeping`, or a ring's
// `producer_waiting`), checks once more for work, then waits on the bell's value read before the check.
// A waker publishes its counter, then rings the bell if somebody announced sleep. Both sides use
// sequentially consistent operations, so at least one of them sees the other's write.
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace cohort::comm::shm {

using Nonce = std::array<std::byte, 16>;

struct alignas(64) RingCounters {
  std::atomic<std::uint64_t> head{0};  // bytes the producer has published
  // How many of its single-copy messages the producer has withdrawn (their sends failed, so their bytes may
  // be gone): the first this many are dropped, not delivered.
  std::atomic<std::uint64_t> withdrawn{0};
  char pad0[48];
  std::atomic<std::uint64_t> tail{0};  // bytes the consumer has taken
  std::atomic<std::uint32_t> producer_waiting{0};  // the producer sleeps until space frees
  char pad1[52];
};

struct alignas(64) MailboxHeader {
  std::uint64_t magic;
  Nonce nonce;
  std::uint32_t slots;
  std::uint64_t ring_bytes;
  alignas(64) std::atomic<std::uint32_t> bell{0};  // futex word: bumped to wake the owner
  std::atomic<std::uint32_t> sleeping{0};         // the owner waits on the bell
};

// A view of one ring, from either side. The other side's counter is checked on every read: a value no
// well-behaved peer can write (more taken than written, more published than fits) breaks the ring for
// good, so that a peer cannot steer a copy outside the segment.
class Ring {
 public:
  Ring() = default;
  Ring(RingCounters* counters, std::byte* bytes, std::uint64_t capacity) : counters_(counters), bytes_(bytes), capacity_(capacity) {}

  // Producer side.
  std::uint64_t free_bytes();
  void write(std::span<const std::byte> data);  // at most free_bytes()
  void publish() { counters_->head.store(written_, std::memory_order_seq_cst); }
  // Consumer side.
  std::uint64_t readable_bytes();
  void read(std::span<std::byte> out);  // at most readable_bytes()
  void skip(std::uint64_t bytes) { read_ += bytes; }
  void release() { counters_->tail.store(read_, std::memory_order_seq_cst); }

  // The peer moved its counter out of range; free_bytes and readable_bytes say 0 from then on.
  bool broken() const { return broken_; }
  RingCounters& counters() const { return *counters_; }
  std::uint64_t capacity() const { return capacity_; }

 private:
  RingCounters* counters_ = nullptr;
  std::byte* bytes_ = nullptr;
  std::uint64_t capacity_ = 0;
  std::uint64_t written_ = 0;  // producer: head, including bytes not yet published
  std::uint64_t read_ = 0;     // consumer: tail, including bytes not yet released
  bool broken_ = false;
};

// Where the slots' counters start in a segment, and where the rings' bytes start in one of `slots` slots.
std::size_t counters_offset();
std::size_t rings_offset(std::uint32_t slots);

// A mapped segment: created (and owned) by the process it belongs to, or opened by a peer.
class Mailbox {
 public:
  // Creates a segment of `slots` rings, reserving its header (reserve_ring() reserves each ring). Throws
  // IoError naming the reason (no shared memory, not enough of it, a size beyond the address space).
  static Mailbox create(std::uint32_t slots, std::uint64_t ring_bytes);
  // Opens a peer's segment by its name ("/proc/PID/fd/N"); throws IoError when it cannot be opened, is
  // not sealed against shrinking, or is not the one offered.
  static Mailbox open(const std::string& name, const Nonce& nonce, std::uint32_t slots, std::uint64_t ring_bytes);
  // The size of a segment of `slots` rings; throws IoError when it is beyond the address space.
  static std::size_t bytes_for(std::uint32_t slots, std::uint64_t ring_bytes);

  Mailbox() = default;
  Mailbox(Mailbox&& other) noexcept;
  Mailbox& operator=(Mailbox&& other) noexcept;
  ~Mailbox();

  const std::string& name() const { return name_; }
  const Nonce& nonce() const { return header().nonce; }
  Ring ring(std::uint32_t slot) const;  // slot < the slot count it was created or opened with
  MailboxHeader& header() const { return *static_cast<MailboxHeader*>(base_); }
  // Reserves the memory of ring `slot` (the creator, before its peer writes there); why not, when it cannot.
  std::optional<std::string> reserve_ring(std::uint32_t slot);
  // Closes the creator's descriptor, through which peers open the segment (the memory stays while mapped);
  // the creator calls it once its peers have mapped it.
  void unlink();

  // Wakes the owner if it announced sleep.
  void ring_bell() const;
  // The owner's own threads: wakes whichever of them waits for the bell, announced or not.
  void wake_owner() const;
  // The owner: sleeps until the bell moves past `seen` or `timeout` passes.
  void wait_for_bell(std::uint32_t seen, std::chrono::microseconds timeout) const;

 private:
  std::string name_;
  void* base_ = nullptr;
  std::size_t size_ = 0;
  // As created or checked at open: the header's copies live in memory the peers can write.
  std::uint32_t slots_ = 0;
  std::uint64_t ring_bytes_ = 0;
  int fd_ = -1;  // created here and not yet unlinked: the sealed memory file peers open
};

}  // namespace cohort::comm::shm
