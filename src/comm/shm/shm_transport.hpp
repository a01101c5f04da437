#pragma once
// ShmTransport, the implementation behind comm::connect_group (private to src/comm/shm/).
//
// It owns a connected TCP transport and keeps using it for the peers on other hosts, and for every peer's
// liveness. For each peer on this host, messages go through a ring in the receiver's mailbox (mailbox.hpp):
// a frame is a 32-byte header (tag, length, kind, address) followed by the payload, streamed through the ring
// when it is larger than the ring.
//
// Pairing: a same-host pair sets up its shared memory when it first talks, at the first send to or receive
// from the peer on either side, or when the peer's offer arrives (over TCP, which then connects on demand).
// Each side reserves its ring for the other and offers its mailbox, maps the other's and answers whether it
// could; both then hold both answers and agree: shared memory, or TCP for good. A send or receive waits for
// that agreement (a round trip, once per pair), so every message of a pair takes the same way. The
// descriptor through which peers open this rank's mailbox stays open until every same-host peer has paired.
//
// Single copy: a message of at least `single_copy_bytes` to a peer that can read this process's memory
// (checked at set-up) travels as a header alone, naming where its bytes are; the receiver copies them
// straight from this process into the posted receive (peer_memory.hpp), or into a buffer when none is
// posted yet, and answers with an acknowledgement frame, which completes the send. Acknowledgements come in
// the order of the sends, so each completes the oldest unacknowledged one. A rank that closes waits a moment
// for its peers to finish reading its messages; a send that fails before the peer read it is withdrawn
// first (a counter beside the ring), and the peer, which checks that counter after each copy, drops it.
//
// Sending: the caller's thread writes what fits straight into the ring and completes the Work once the last
// byte is in (the caller's buffer is free then); what does not fit waits in the peer's queue for the
// progress thread or a waiting caller. Receiving: either of them reads each ring, copying a frame straight
// into the posted receive when there is one, else into a buffer that the next matching recv() takes.
//
// A thread waiting on one of these operations makes the progress itself for a moment (Work's poll) before
// it sleeps: on one host the next message of a collective usually arrives within microseconds, and moving
// it on the waiting thread saves two thread wake-ups per message. It moves every link's bytes, as the
// progress thread does. The progress thread steps aside when it finds nothing to move while callers poll,
// or began polling in the last 5 ms (a collective between its waits), parked without telling the peers,
// whose sends then ring no bell, so that the caller keeps its core and the progress thread does not wake
// for each message. A caller that gives up polling to sleep wakes it at once, and it stays while any such
// caller sleeps. A caller yields the core between looks, so polling pays even where a host runs more ranks
// than it has cores; there the progress thread's step aside leaves the time slices to the ranks with work.
//
// Peer memory: where every peer of the group is on this host and single copy is on, the transport lets the
// collectives read the peers' buffers themselves (peer_memory(), through the same checked process handles),
// so that an allreduce reduces straight from them (direct_allreduce.hpp). Asking whether it can read every
// peer pairs with each of them.
//
// Failures come from the TCP transport: the progress thread keeps a receive posted there per shared-memory
// peer on a tag nothing sends, and when it fails (the peer was lost, the group broke, or the peer left)
// the same failure reaches the shared-memory operations. A peer that left cleanly is drained first: what it
// wrote before its goodbye is still delivered. A frame header that breaks the protocol (a length above
// the limit), or ring counters the peer could not have written, fail every operation of this rank with
// ProtocolError naming the peer, as on TCP.
#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "cohort/comm/shared_memory.hpp"
#include "comm/matching.hpp"
#include "mailbox.hpp"
#include "peer_memory.hpp"

namespace cohort::comm::shm {

class ShmTransport : public Transport, private PeerMemory {
 public:
  // A peer that shares this host with this rank, and the mailbox it must offer: a ring for each of its own
  // same-host peers, of ring_bytes each, this rank's in slot your_slot.
  struct LocalPeer {
    int rank = -1;
    std::uint32_t slots = 0;
    std::uint32_t your_slot = 0;  // this rank's ring among them
    std::size_t ring_bytes = 0;
  };
  // `local` lists the peers that share this host with this rank; `ring_bytes` is this rank's rings' size.
  // Frames above `max_frame_bytes` are a protocol violation, as on TCP.
  ShmTransport(std::unique_ptr<Transport> tcp, const std::vector<LocalPeer>& local, std::size_t ring_bytes,
               const SharedMemoryOptions& options, std::uint64_t max_frame_bytes);
  ~ShmTransport() override;

  int rank() const override { return tcp_->rank(); }
  int size() const override { return tcp_->size(); }
  std::string describe(int rank) const override { return tcp_->describe(rank); }
  std::chrono::milliseconds timeout() const override { return tcp_->timeout(); }
  // Progress and stuck peers travel over TCP, with the liveness.
  void report_progress(std::uint64_t collectives) override { tcp_->report_progress(collectives); }
  std::optional<std::uint64_t> progress_of(int peer) const override { return tcp_->progress_of(peer); }
  void declare_stuck(int peer, const std::string& reason) override { tcp_->declare_stuck(peer, reason); }
  void expect_messages_up_to(std::uint64_t bytes) override;
  void announce_failure(const std::string& reason) override { tcp_->announce_failure(reason); }
  WorkPtr send(int peer, Tag tag, std::span<const std::byte> data) override;
  WorkPtr recv(int peer, Tag tag, std::span<std::byte> out) override;
  // None unless every peer is on this host; it reads them only where single copy is on.
  PeerMemory* peer_memory() override;
  // A ring's size: larger messages stream through the rings in pieces.
  std::size_t whole_message_bytes() const override { return ring_bytes_; }
  bool ranks_have_own_cores() const override { return core_per_rank_; }

  // How many peers share memory with this rank (the others use TCP), and the size of each ring its own
  // mailbox holds for them.
  int shared_memory_peers() const;
  std::size_t ring_bytes() const { return ring_bytes_; }
  // How many of its peers read this rank's large messages from its memory, how many peers' large messages
  // this rank reads from theirs, and how many messages it has read so.
  int single_copy_peers() const;
  int single_copy_sources() const;
  std::uint64_t single_copy_messages() const { return single_copy_messages_.load(std::memory_order_relaxed); }
  // How many reads and writes of peers' memory the collectives made through peer_memory().
  std::uint64_t peer_memory_reads() const { return peer_memory_reads_.load(std::memory_order_relaxed); }
  std::uint64_t peer_memory_writes() const { return peer_memory_writes_.load(std::memory_order_relaxed); }
  // How often the progress thread has stepped aside for polling callers; never while a caller sleeps.
  std::uint64_t step_asides() const { return step_asides_.load(std::memory_order_relaxed); }
  // How many callers sleep on an operation now, after polling in vain.
  int callers_sleeping() const { return callers_sleeping_.load(std::memory_order_seq_cst); }

 private:
  bool can_reach_every_peer() override;
  void read(int peer, std::span<const PeerCopy> copies) override;
  void write(int peer, std::uint64_t address, std::span<const std::byte> bytes) override;
  // Throws what a failed read or write of `peer`'s memory amounts to, once news of the peer's own failure
  // had its chance to come first.
  [[noreturn]] void fail_access(int peer, const PeerAccessError& error, bool writing, std::uint64_t address, std::size_t bytes);
  // A waiting caller's turn at moving the bytes (Work's poll). Where each rank has a core, the progress
  // thread steps aside while callers poll (step_aside()).
  class CallerPoll final : public Poller {
   public:
    explicit CallerPoll(ShmTransport& transport) : transport_(transport) {}
    void begin() override;
    bool poll() override {
      transport_.move_bytes();
      return true;
    }
    void end(bool done) override;
    void slept() override;

   private:
    ShmTransport& transport_;
  };

  enum class FrameKind : std::uint64_t { Inline = 0, SingleCopy = 1, Acknowledgement = 2 };
  struct FrameHeader {
    Tag tag = 0;
    std::uint64_t length = 0;
    FrameKind kind = FrameKind::Inline;
    std::uint64_t address = 0;  // single copy: where the bytes are in the sender
  };
  struct Outgoing {
    Tag tag = 0;
    std::span<const std::byte> data{};
    WorkPtr work{};  // none for an acknowledgement
    FrameKind kind = FrameKind::Inline;
    bool header_written = false;
    std::size_t written = 0;
  };
  // An incoming frame being read: into a posted receive, a buffer, or nowhere (its receive failed).
  struct Incoming {
    Tag tag = 0;
    std::uint64_t length = 0;
    std::uint64_t done = 0;
    std::byte* into = nullptr;
    WorkPtr work{};
    std::vector<std::byte> buffer{};
    bool discard = false;
  };
  // What a rank tells a same-host peer about its mailbox.
  struct Offer {
    char name[64];  // empty: this rank has no mailbox
    Nonce nonce;
    std::uint64_t ring_bytes;
    std::uint32_t slots;
    std::uint32_t slot;  // the receiving peer's ring in this mailbox
    std::int64_t pid;    // where a peer reads this rank's single-copy messages
    std::uint64_t nonce_address;  // this mailbox's nonce in this process, which a peer reads to check that it can
  };
  enum class Pairing { Unpaired, Offered, Answered, SharedMemory, Tcp, Failed };
  struct Link {  // one same-host peer
    int peer = -1;
    std::uint32_t slot = 0;  // this rank's ring for the peer in its own mailbox, and its index in the peer's offer
    LocalPeer expected;      // the mailbox the peer must offer
    // Pairing, under pairing_mutex; `pairing` is read without it (SharedMemory: every field below is set).
    std::mutex pairing_mutex;
    std::atomic<Pairing> pairing{Pairing::Unpaired};
    Offer offered{};  // this rank's offer, and the peer's
    Offer offer{};
    std::uint8_t opened = 0;  // what this rank answers, and what the peer answered
    std::uint8_t answer = 0;
    WorkPtr offer_arrival;  // the peer's offer (posted at construction), and its answer
    WorkPtr answer_arrival;
    std::optional<Mailbox> mapped;  // the peer's mailbox, between the answers
    std::optional<ProcessHandle> checked_process;  // the one whose memory was checked, for `process`
    std::exception_ptr pairing_failure;
    pid_t pid = 0;
    bool single_copy_out = false;  // the peer reads this rank's large messages from this process
    bool single_copy_in = false;   // this rank reads the peer's large messages from its process
    std::optional<ProcessHandle> process;  // the process read from: a read is sound only while it lives
    std::uint64_t single_copies_sent = 0;  // guarded by send_mutex
    std::uint64_t single_copies_read = 0;  // guarded by read_mutex
    Mailbox theirs;  // where this rank writes
    Ring outbound;
    Ring inbound;  // this rank's ring for the peer, in its own mailbox
    std::mutex send_mutex;
    std::deque<Outgoing> queue;  // guarded by send_mutex
    std::atomic<bool> queued{false};  // !queue.empty(), readable without the lock
    std::deque<WorkPtr> unacknowledged;  // single-copy sends the peer has not read yet; guarded by send_mutex
    std::mutex read_mutex;  // the inbound ring and `incoming`: the progress thread, or a waiting caller
    std::optional<Incoming> incoming;
    std::optional<std::string> corrupt;  // a bad frame header: the ring's framing is lost (under read_mutex)
    Breakage corrupt_as = Breakage::Protocol;  // Lost: the peer's process ended while its memory was read
    WorkPtr watch;                     // a TCP receive that fails when the peer does
    std::optional<std::string> gone;   // why operations with this peer fail; guarded by state_mutex_
    Breakage gone_by = Breakage::Lost;  // what its failed operations throw
  };

  void create_mailbox(const std::vector<LocalPeer>& local, std::size_t ring_bytes);
  // Why this rank reserves no mailbox (the host's memory); none when it may.
  std::optional<std::string> reservation_refusal(const std::vector<LocalPeer>& local, std::size_t ring_bytes) const;
  // Pairing. advance_pairing() takes the steps it can without waiting (the caller holds pairing_mutex);
  // await_pairing() pairs and waits until the pair has agreed (at once when it has), and returns why it
  // cannot when it cannot.
  void advance_pairing(Link& link, bool initiate);
  std::exception_ptr await_pairing(Link& link);
  std::uint8_t map_offer(Link& link);  // what this rank answers the peer's offer
  void paired(Link& link, bool shared);
  // The progress thread's: offers that arrived, answers awaited. Whether a pairing is still under way.
  bool advance_pairings();
  static bool is_paired(const Link& link) { return link.pairing.load(std::memory_order_acquire) == Pairing::SharedMemory; }
  void queue_frame(Link& link, Outgoing outgoing);  // the caller holds link.send_mutex
  Link* link_of(int peer) const;
  // Writes what fits of the queue's front frames; the caller holds link.send_mutex.
  void write_queued(Link& link);
  void progress();
  // One pass over the paired links: what has arrived is read and what waits is written, each link skipped
  // while another thread holds it. The progress thread's step, and a polling caller's.
  bool move_bytes();
  // The progress thread parks for kStepAside while callers poll, or began polling since it last parked so
  // (`polls_seen`), unless one of them sleeps; false when it does not park.
  bool step_aside(std::uint64_t& polls_seen);
  bool read_inbound(Link& link);  // the caller holds link.read_mutex
  // Begins reading a frame; false (and the link corrupt) when it is one that no receive awaits and larger than expected.
  bool start_frame(Link& link, Tag tag, std::uint64_t length);
  bool check_header(Link& link, const FrameHeader& header);  // false: the link is corrupt
  // What a read or write of the link's peer came to: `error`, or that its process ended meanwhile.
  static std::optional<PeerAccessError> access_outcome(const Link& link, std::optional<PeerAccessError> error);
  // Reads the started frame's bytes from the peer's process and acknowledges them; false when it could not.
  bool copy_from_peer(Link& link, std::uint64_t address);
  bool acknowledged(Link& link);  // the oldest single-copy send to the peer completes
  void release_inbound(Link& link);
  void await_acknowledgements();
  // Every send to the peer not yet complete fails: the queued frames, and the single-copy sends not yet
  // acknowledged, withdrawn first so that the peer drops them instead of reading buffers their owners may
  // free. The caller holds link.send_mutex.
  void fail_sends(Link& link, const std::exception_ptr& error);
  void finish_frame(Link& link);
  bool work_waiting();
  void check_watches();
  bool is_gone(const Link& link) const;
  std::vector<Link*> remaining_links() const;  // those not gone
  // Fails what waits on the links' peers, now and later, after delivering what they had written.
  void fail_links(const std::vector<Link*>& links, const std::string& reason, Breakage breakage);
  std::exception_ptr error_for(int peer) const;  // under state_mutex_
  void wake_progress() const;

  std::unique_ptr<Transport> tcp_;
  RankNames names_;  // as tcp_ describes them
  std::uint64_t max_frame_bytes_;
  std::size_t single_copy_bytes_;
  std::size_t ring_bytes_;
  bool have_mailbox_ = false;
  std::mutex mailbox_mutex_;  // reserving rings, and closing the descriptor once every peer has paired
  int undecided_ = 0;         // peers not yet paired; under mailbox_mutex_
  std::atomic<bool> told_refusal_{false};  // the single-copy refusal is logged once
  std::atomic<std::uint64_t> expected_bytes_;  // the largest frame buffered while no receive awaits it
  Mailbox own_;
  std::vector<std::unique_ptr<Link>> links_;  // one per same-host peer
  std::vector<Link*> link_by_rank_;  // null: another host's, always TCP

  mutable std::mutex state_mutex_;  // receive matching and failures
  Matcher matcher_;

  std::atomic<std::uint64_t> single_copy_messages_{0};
  std::atomic<std::uint64_t> peer_memory_reads_{0};
  std::atomic<std::uint64_t> peer_memory_writes_{0};
  // Whether the host has a core for each of its ranks: the direct allreduce's pieces and threshold follow it.
  const bool core_per_rank_;
  // The callers and the progress thread take turns at moving the bytes (CallerPoll), on any number of cores:
  // with more ranks than cores, a progress thread that polls beside its callers takes time slices from the
  // ranks that have work. On 2 cores of a Sapphire Rapids Xeon, 3 alternating runs, taking turns measured
  // 1.1-2.5x from 4 KiB to 256 KiB on 4 ranks (level from 512 KiB) and 1.1-2x from 4 KiB to 2 MiB on 3.
  std::atomic<int> callers_polling_{0};
  std::atomic<std::uint64_t> caller_polls_{0};  // begun so far
  std::atomic<int> callers_sleeping_{0};        // after polling in vain
  std::atomic<bool> stepping_aside_{false};     // the progress thread is parked for them
  std::atomic<std::uint64_t> step_asides_{0};
  CallerPoll caller_poll_{*this};
  std::atomic<bool> stopping_{false};
  std::thread progress_thread_;
};

}  // namespace cohort::comm::shm
