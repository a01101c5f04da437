#include "shm_transport.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <fmt/format.h>

#include "cohort/core/check.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/format.hpp"
#include "cohort/core/logging.hpp"
#include "cohort/core/parallel.hpp"
#include "comm/delivery.hpp"
#include "host_memory.hpp"

namespace cohort::comm {
namespace shm {
namespace {

// Tags of the set-up exchange and of the liveness watch, on the TCP links.
constexpr Tag kOfferTag = 0x53484D4F46464552ull;   // "SHMOFFER"
constexpr Tag kAnswerTag = 0x53484D414E535752ull;  // "SHMANSWR"
constexpr Tag kWatchTag = 0x53484D5741544348ull;   // "SHMWATCH"

constexpr std::size_t kFrameHeaderBytes = 32;  // tag, length, kind, address
constexpr std::size_t kSingleCopyPiece = std::size_t{4} << 20;  // a buffered message grows by this as it is read
constexpr std::chrono::milliseconds kCloseWaitForReaders{500};
constexpr std::chrono::milliseconds kWatchInterval{20};
// How long a read of a peer's memory that failed waits for news of that peer's failure before it names
// the peer lost or its address a protocol error: a failing peer frees its vector, and may end, before its
// report arrives.
constexpr std::chrono::milliseconds kFailureNewsGrace{500};
constexpr std::chrono::milliseconds kPairingLookInterval{1};
constexpr std::chrono::microseconds kPollAfterProgress{50};
// How long the progress thread steps aside at a time while callers poll, and how recently a caller must have
// begun polling for it to step aside again. A caller that goes on to sleep wakes it at once; a longer step
// means fewer timer wake-ups taking a polling caller's core, at the cost of that much delay for bytes nobody
// waits for once the callers stopped. On 2 ranks of 2 cores, medians of 5 runs: 5 ms against 1 ms measured
// 1.02-1.1x from 16 KiB to 512 KiB, 20 ms was no better than 5; stepping aside for messages of any size, not
// only below 16 KiB, 1.0-1.3x from 4 KiB to 512 KiB.
constexpr std::chrono::microseconds kStepAside{5000};
constexpr std::size_t kMaxRingBytes = std::size_t{1} << 30;

// What a rank answers a peer's offer.
constexpr std::uint8_t kMapped = 1;
constexpr std::uint8_t kReadsYourMemory = 2;

std::span<const std::byte> bytes_of(const auto& value) { return std::as_bytes(std::span(&value, 1)); }
std::span<std::byte> bytes_of(auto& value) { return std::as_writable_bytes(std::span(&value, 1)); }

// Why this process cannot read the offering peer's single-copy messages (none when it can). The process
// must be the one that holds the peer's segment (`name` is /proc/PID/fd/N, opened already), and its memory
// must hold the segment's nonce where the peer says it keeps it.
template <typename Offer>
std::optional<std::string> refuses_single_copy(const Offer& offer, const std::string& name) {
  const long holder = std::strtol(name.c_str() + std::strlen("/proc/"), nullptr, 10);
  if (offer.pid != holder) return fmt::format("it named process {}, not {}, which holds its segment", offer.pid, holder);
  Nonce found{};
  if (auto error = read_peer_memory(static_cast<pid_t>(offer.pid), offer.nonce_address, found)) return error->reason;
  if (found != offer.nonce) return "its memory does not hold its segment's nonce where it said";
  return std::nullopt;
}

std::string broken_ring(const ShmTransport& transport, int peer) {
  return fmt::format("protocol error: {} moved the counters of a shared-memory ring out of range", transport.describe(peer));
}

// A Work that failed already: a pairing that could not be made.
WorkPtr failed_work(PeerOperation what, const std::exception_ptr& error) {
  auto work = std::make_shared<Work>(std::move(what));
  work->fail(error);
  return work;
}

}  // namespace

ShmTransport::ShmTransport(std::unique_ptr<Transport> tcp, const std::vector<LocalPeer>& local, std::size_t ring_bytes,
                           const SharedMemoryOptions& options, std::uint64_t max_frame_bytes)
    : tcp_(std::move(tcp)), names_(rank_names(*tcp_)), max_frame_bytes_(max_frame_bytes), single_copy_bytes_(options.single_copy_bytes), ring_bytes_(ring_bytes), expected_bytes_(max_frame_bytes), link_by_rank_(static_cast<std::size_t>(tcp_->size()), nullptr),
      core_per_rank_(local.size() + 1 <= static_cast<std::size_t>(usable_cores())) {
  create_mailbox(local, ring_bytes);
  undecided_ = static_cast<int>(local.size());
  for (std::size_t i = 0; i < local.size(); ++i) {
    auto link = std::make_unique<Link>();
    link->peer = local[i].rank;
    link->slot = static_cast<std::uint32_t>(i);
    link->expected = local[i];
    // Posted without connecting: the peer's offer comes when it first needs this rank.
    link->offer_arrival = tcp_->recv_unprompted(link->peer, kOfferTag, bytes_of(link->offer));
    link_by_rank_[static_cast<std::size_t>(link->peer)] = link.get();
    links_.push_back(std::move(link));
  }
  log::info("{}: shared memory with each of the {} peer(s) on its host as they first talk (rings of {}; messages from {} "
            "bytes read straight from the sender's memory)",
            describe(rank()), local.size(),
            binary_size(ring_bytes),
            single_copy_bytes_);
  progress_thread_ = std::thread([this] { progress(); });
}

ShmTransport::~ShmTransport() {
  log::info("{}: shared memory with {} of the {} peer(s) on its host ({} read its messages from {} bytes straight from its memory)",
            describe(rank()), shared_memory_peers(), links_.size(), single_copy_peers(), single_copy_bytes_);
  await_acknowledgements();
  if (progress_thread_.joinable()) {
    stopping_ = true;
    if (have_mailbox_) own_.wake_owner();  // a wait that starts now returns at once
    progress_thread_.join();
  }
  for (auto& link : links_) {
    {
      const std::lock_guard lock(link->send_mutex);
      fail_sends(*link, shut_down_error());
    }
    const std::lock_guard reading(link->read_mutex);
    if (link->incoming && link->incoming->work) link->incoming->work->fail(shut_down_error());
  }
  {
    const std::lock_guard lock(state_mutex_);
    matcher_.fail_posted(shut_down_error);
  }
  tcp_.reset();  // goodbyes, after which the peers drain what this rank wrote
}

std::optional<std::string> ShmTransport::reservation_refusal(const std::vector<LocalPeer>& local, std::size_t ring_bytes) const {
  const auto available = available_memory_bytes();
  if (!available) return std::nullopt;
  // Every rank of this host reserves its mailbox at about this moment: the check is of all of them.
  const auto slots = static_cast<std::uint32_t>(local.size());
  std::uint64_t host_bytes = Mailbox::bytes_for(slots, ring_bytes);
  for (const LocalPeer& peer : local) host_bytes += Mailbox::bytes_for(peer.slots, peer.ring_bytes);
  return shm::reservation_refusal(host_bytes, *available);
}

void ShmTransport::create_mailbox(const std::vector<LocalPeer>& local, std::size_t ring_bytes) {
  try {
    if (auto refusal = reservation_refusal(local, ring_bytes)) throw IoError(*refusal);
    own_ = Mailbox::create(static_cast<std::uint32_t>(local.size()), ring_bytes);
    have_mailbox_ = true;
  } catch (const IoError& error) {
    log::warning("{}: no shared memory, the peers on its host are reached over TCP: {}", describe(rank()), error.what());
  }
}

void ShmTransport::advance_pairing(Link& link, bool initiate) {
  const auto arrived = [](const WorkPtr& work) { return work->done(); };
  try {
    if (link.pairing == Pairing::Unpaired && (initiate || arrived(link.offer_arrival))) {
      std::memset(&link.offered, 0, sizeof link.offered);
      std::optional<std::string> unreserved;
      if (have_mailbox_) {
        const std::lock_guard lock(mailbox_mutex_);
        unreserved = own_.reserve_ring(link.slot);
      }
      if (unreserved) log::warning("{}: {} is reached over TCP: {}", describe(rank()), describe(link.peer), *unreserved);
      if (have_mailbox_ && !unreserved) {
        std::snprintf(link.offered.name, sizeof link.offered.name, "%s", own_.name().c_str());
        link.offered.nonce = own_.nonce();
        link.offered.nonce_address = reinterpret_cast<std::uint64_t>(&own_.header().nonce);
      }
      link.offered.ring_bytes = ring_bytes_;
      link.offered.slots = static_cast<std::uint32_t>(links_.size());
      link.offered.slot = link.slot;
      link.offered.pid = ::getpid();
      link.answer_arrival = tcp_->recv(link.peer, kAnswerTag, bytes_of(link.answer));
      tcp_->send(link.peer, kOfferTag, bytes_of(link.offered));  // a failure fails the answer's receive too
      link.pairing = Pairing::Offered;
    }
    if (link.pairing == Pairing::Offered && arrived(link.offer_arrival)) {
      link.offer_arrival->wait(std::chrono::milliseconds(0));  // its failure, if it failed
      link.opened = map_offer(link);
      tcp_->send(link.peer, kAnswerTag, bytes_of(link.opened));
      link.pairing = Pairing::Answered;
    }
    if (link.pairing == Pairing::Answered && arrived(link.answer_arrival)) {
      link.answer_arrival->wait(std::chrono::milliseconds(0));
      paired(link, (link.opened & kMapped) != 0 && (link.answer & kMapped) != 0);
    }
  } catch (const std::exception&) {
    link.pairing_failure = std::current_exception();
    link.pairing = Pairing::Failed;
  }
}

std::uint8_t ShmTransport::map_offer(Link& link) {
  const Offer& offer = link.offer;
  const std::string name(offer.name, strnlen(offer.name, sizeof offer.name));
  // Without a mailbox of its own this rank offered none, and the pair keeps TCP whatever it maps.
  if (name.empty() || link.offered.name[0] == '\0') return 0;
  try {
    if (offer.slots != link.expected.slots || offer.ring_bytes != link.expected.ring_bytes || offer.slot != link.expected.your_slot)
      throw IoError(fmt::format("its shared-memory settings differ from this rank's ({} rings of {} bytes, this rank's in "
                                "slot {}, where this rank's settings give it {} of {}, in slot {})",
                                offer.slots, offer.ring_bytes, offer.slot, link.expected.slots, link.expected.ring_bytes,
                                link.expected.your_slot));
    if (offer.nonce == own_.nonce()) throw IoError("it offered this rank's own segment");
    link.mapped = Mailbox::open(name, offer.nonce, offer.slots, offer.ring_bytes);
    std::uint8_t opened = kMapped;
    if (single_copy_bytes_ > 0) {
      // Opened before the check, so that the process checked is the one later reads are checked against.
      link.checked_process = ProcessHandle::open(static_cast<pid_t>(offer.pid));
      auto refused = refuses_single_copy(offer, name);
      if (!refused && link.checked_process && link.checked_process->ended()) refused = "its process has ended";
      if (!refused) opened |= kReadsYourMemory;
      else if (!told_refusal_.exchange(true))
        log::warning("{}: messages from {} take two copies through shared memory, not one: {}", describe(rank()),
                     describe(link.peer), *refused);
    }
    return opened;
  } catch (const IoError& error) {
    log::warning("{}: {} is reached over TCP: {}", describe(rank()), describe(link.peer), error.what());
    link.mapped.reset();
    return 0;
  }
}

void ShmTransport::paired(Link& link, bool shared) {
  if (shared) {
    link.pid = static_cast<pid_t>(link.offer.pid);
    link.single_copy_in = (link.opened & kReadsYourMemory) != 0;
    if (link.single_copy_in) link.process = std::move(link.checked_process);
    link.single_copy_out = (link.answer & kReadsYourMemory) != 0;
    link.theirs = std::move(*link.mapped);
    link.outbound = link.theirs.ring(link.offer.slot);
    link.inbound = own_.ring(link.slot);
    link.watch = tcp_->recv(link.peer, kWatchTag, {});
  }
  link.mapped.reset();
  link.checked_process.reset();
  link.pairing.store(shared ? Pairing::SharedMemory : Pairing::Tcp, std::memory_order_release);
  const std::lock_guard lock(mailbox_mutex_);
  if (--undecided_ == 0 && have_mailbox_) own_.unlink();  // every peer that could map it has
}

std::exception_ptr ShmTransport::await_pairing(Link& link) {
  if (link.pairing.load(std::memory_order_acquire) == Pairing::Tcp) return nullptr;
  const auto deadline = std::chrono::steady_clock::now() + timeout();
  for (;;) {
    {
      const std::lock_guard lock(link.pairing_mutex);
      advance_pairing(link, true);
      switch (link.pairing.load()) {
        case Pairing::SharedMemory:
        case Pairing::Tcp: return nullptr;
        case Pairing::Failed: return link.pairing_failure;
        default: break;
      }
    }
    const WorkPtr& next = link.pairing == Pairing::Offered ? link.offer_arrival : link.answer_arrival;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      return std::make_exception_ptr(TimeoutError(fmt::format(
          "{} could not set up shared memory with {} within {} ms: it did not answer", describe(rank()), describe(link.peer), timeout().count())));
    try {
      next->wait_for(std::min(left, std::chrono::milliseconds(10)));
    } catch (const std::exception&) {  // advance_pairing() records it
    }
  }
}

bool ShmTransport::advance_pairings() {
  bool under_way = false;
  for (auto& link : links_) {
    const Pairing state = link->pairing.load(std::memory_order_acquire);
    if (state == Pairing::SharedMemory || state == Pairing::Tcp || state == Pairing::Failed) continue;
    if (state == Pairing::Unpaired && !link->offer_arrival->done()) continue;
    const std::unique_lock lock(link->pairing_mutex, std::try_to_lock);  // else a caller is pairing it
    if (lock) advance_pairing(*link, false);
    const Pairing now = link->pairing.load(std::memory_order_acquire);
    under_way |= now == Pairing::Offered || now == Pairing::Answered;
  }
  return under_way;
}

int ShmTransport::shared_memory_peers() const {
  return static_cast<int>(std::ranges::count_if(links_, [](const auto& link) { return is_paired(*link); }));
}

int ShmTransport::single_copy_peers() const {
  return static_cast<int>(std::ranges::count_if(links_, [](const auto& link) { return is_paired(*link) && link->single_copy_out; }));
}

int ShmTransport::single_copy_sources() const {
  return static_cast<int>(std::ranges::count_if(links_, [](const auto& link) { return is_paired(*link) && link->single_copy_in; }));
}

// Offered whatever this rank's single-copy setting, so that every rank on the host takes the same first
// step of a collective; can_reach_every_peer() answers for the setting.
PeerMemory* ShmTransport::peer_memory() {
  const bool every_peer_here = static_cast<int>(links_.size()) + 1 == size();
  return every_peer_here && size() > 1 ? this : nullptr;
}

bool ShmTransport::can_reach_every_peer() {
  if (single_copy_bytes_ == 0) return false;
  for (const auto& link : links_) {
    if (auto failure = await_pairing(*link)) std::rethrow_exception(failure);
    // A handle on the process too: without one, a pid its process left to another could be written.
    if (!is_paired(*link) || !link->single_copy_in || !link->process) return false;
  }
  return true;
}

void ShmTransport::read(int peer, std::span<const PeerCopy> copies) {
  const Link* link = link_of(peer);
  COHORT_CHECK(link != nullptr && is_paired(*link) && link->single_copy_in, "{} cannot read the memory of {}",
               describe(rank()), describe(peer));
  const auto error = access_outcome(*link, read_peer_memory(link->pid, copies));
  peer_memory_reads_.fetch_add(1, std::memory_order_relaxed);
  if (!error) return;
  const PeerCopy& failed = copies[std::min(error->copy, copies.size() - 1)];
  fail_access(peer, *error, false, failed.address, failed.into.size());
}

void ShmTransport::write(int peer, std::uint64_t address, std::span<const std::byte> bytes) {
  const Link* link = link_of(peer);
  COHORT_CHECK(link != nullptr && is_paired(*link) && link->single_copy_in && link->process, "{} cannot write the memory of {}",
               describe(rank()), describe(peer));
  // Asked before, not only after: a process that ended may have left its pid to another, which must never be
  // written. (It would take the kernel handing the pid out again within this call to get past it.)
  const auto error = access_outcome(*link, link->process->ended() ? std::nullopt : write_peer_memory(link->pid, address, bytes));
  peer_memory_writes_.fetch_add(1, std::memory_order_relaxed);
  if (error) fail_access(peer, *error, true, address, bytes.size());
}

void ShmTransport::fail_access(int peer, const PeerAccessError& error, bool writing, std::uint64_t address, std::size_t bytes) {
  // A peer whose collective failed frees its vector as it unwinds, and may end, before the news of its
  // failure comes: that failure, once it comes, is the cause to name.
  for (const auto give_up = std::chrono::steady_clock::now() + kFailureNewsGrace;;) {
    {
      const std::lock_guard state(state_mutex_);
      if (auto failure = error_for(peer)) std::rethrow_exception(failure);
    }
    if (std::chrono::steady_clock::now() >= give_up) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const char* verb = writing ? "write" : "read";
  if (error.process_gone())
    throw IoError(fmt::format("lost {}: {} while this rank {} its memory", describe(peer), error.reason, writing ? "wrote" : "read"));
  // Only an address that is not the peer's memory is the peer's doing; a refusal of the kernel is this host's.
  if (error.code != EFAULT) throw IoError(fmt::format("{} cannot {} the memory of {}: {}", describe(rank()), verb, describe(peer), error.reason));
  throw ProtocolError(fmt::format("protocol error: {} named memory this rank cannot {} ({}): {} bytes at {:#x}", describe(peer), verb,
                                  error.reason, bytes, address));
}

ShmTransport::Link* ShmTransport::link_of(int peer) const {
  COHORT_CHECK(peer >= 0 && peer < size() && peer != rank(), "rank {} cannot address peer {} in a group of {}", rank(), peer, size());
  return link_by_rank_[static_cast<std::size_t>(peer)];
}

std::exception_ptr ShmTransport::error_for(int peer) const {
  const Link& link = *link_by_rank_[static_cast<std::size_t>(peer)];
  if (!link.gone) return nullptr;
  return broken_group_error(link.gone_by, *link.gone);
}

void ShmTransport::wake_progress() const { own_.ring_bell(); }

// ---- sending

WorkPtr ShmTransport::send(int peer, Tag tag, std::span<const std::byte> data) {
  Link* link = link_of(peer);
  if (link != nullptr && !is_paired(*link)) {
    if (auto failure = await_pairing(*link)) return failed_work(PeerOperation{"send to", names_, peer, tag}, failure);
  }
  if (link == nullptr || !is_paired(*link)) return tcp_->send(peer, tag, data);
  const bool by_reference = link->single_copy_out && single_copy_bytes_ > 0 && data.size() >= single_copy_bytes_;
  // The waiting thread moves the bytes itself for a moment (poll) before it sleeps; a single-copy send's
  // acknowledgement, which completes it, among them.
  auto work = std::make_shared<Work>(PeerOperation{"send to", names_, peer, tag}, caller_poll_);
  const std::lock_guard lock(link->send_mutex);
  {
    // Checked under the send lock: a failure after this point finds the frame in the queue and fails it.
    const std::lock_guard state(state_mutex_);
    if (auto error = error_for(peer)) {
      work->fail(error);
      return work;
    }
  }
  queue_frame(*link, {.tag = tag, .data = data, .work = work, .kind = by_reference ? FrameKind::SingleCopy : FrameKind::Inline});
  return work;
}

void ShmTransport::queue_frame(Link& link, Outgoing outgoing) {
  link.queue.push_back(std::move(outgoing));
  if (link.queue.size() == 1) write_queued(link);
  if (!link.queue.empty()) wake_progress();
}

void ShmTransport::write_queued(Link& link) {
  Ring& ring = link.outbound;
  bool wrote = false;
  std::vector<WorkPtr> finished;
  while (!link.queue.empty()) {
    Outgoing& outgoing = link.queue.front();
    if (!outgoing.header_written) {
      if (ring.free_bytes() < kFrameHeaderBytes) break;
      const bool by_reference = outgoing.kind == FrameKind::SingleCopy;
      const FrameHeader header{.tag = outgoing.tag, .length = outgoing.data.size(), .kind = outgoing.kind,
                               .address = by_reference ? reinterpret_cast<std::uint64_t>(outgoing.data.data()) : 0};
      ring.write(bytes_of(header));
      outgoing.header_written = wrote = true;
      if (outgoing.kind != FrameKind::Inline) outgoing.written = outgoing.data.size();  // no bytes follow in the ring
    }
    const std::size_t piece = std::min<std::size_t>(outgoing.data.size() - outgoing.written, ring.free_bytes());
    if (piece > 0) {
      ring.write(outgoing.data.subspan(outgoing.written, piece));
      outgoing.written += piece;
      wrote = true;
    }
    if (outgoing.written < outgoing.data.size()) break;
    // Published below, before the peer can read it: its acknowledgement finds the send here.
    if (outgoing.kind == FrameKind::SingleCopy) {
      ++link.single_copies_sent;
      link.unacknowledged.push_back(std::move(outgoing.work));
    }
    else if (outgoing.work) finished.push_back(std::move(outgoing.work));
    link.queue.pop_front();
  }
  link.queued.store(!link.queue.empty(), std::memory_order_seq_cst);  // seq_cst: read against `sleeping`
  if (!wrote) return;
  ring.publish();
  link.theirs.ring_bell();
  for (const WorkPtr& work : finished) work->complete();
}

// ---- receiving

WorkPtr ShmTransport::recv(int peer, Tag tag, std::span<std::byte> out) {
  Link* link = link_of(peer);
  if (link != nullptr && !is_paired(*link)) {
    if (auto failure = await_pairing(*link)) return failed_work(PeerOperation{"recv from", names_, peer, tag}, failure);
  }
  if (link == nullptr || !is_paired(*link)) return tcp_->recv(peer, tag, out);
  auto work = std::make_shared<Work>(PeerOperation{"recv from", names_, peer, tag}, caller_poll_);
  const std::lock_guard lock(state_mutex_);
  if (matcher_.take_buffered(*this, peer, tag, out, *work)) return work;
  if (auto error = error_for(peer)) {
    work->fail(error);
    return work;
  }
  matcher_.post(peer, tag, {out, work});
  return work;
}

bool ShmTransport::read_inbound(Link& link) {
  static_assert(sizeof(FrameHeader) == kFrameHeaderBytes);
  Ring& ring = link.inbound;
  bool progressed = false;
  while (!link.corrupt) {
    std::uint64_t readable = ring.readable_bytes();
    if (ring.broken()) {
      link.corrupt = broken_ring(*this, link.peer);
      return true;
    }
    if (!link.incoming) {
      if (readable < kFrameHeaderBytes) break;
      FrameHeader header{};
      ring.read(bytes_of(header));
      readable -= kFrameHeaderBytes;
      progressed = true;
      if (!check_header(link, header)) return true;
      if (header.kind == FrameKind::Acknowledgement) {
        release_inbound(link);
        if (!acknowledged(link)) return true;
        continue;
      }
      if (!start_frame(link, header.tag, header.length)) return true;
      if (header.kind == FrameKind::SingleCopy) {
        release_inbound(link);
        if (!copy_from_peer(link, header.address)) return true;
        finish_frame(link);
        continue;
      }
    }
    Incoming& incoming = *link.incoming;
    const std::uint64_t piece = std::min(readable, incoming.length - incoming.done);
    if (piece > 0) {
      if (incoming.discard) {
        ring.skip(piece);
      } else if (incoming.work) {
        ring.read({incoming.into + incoming.done, static_cast<std::size_t>(piece)});
      } else {
        // Buffered: grown as the bytes come, so that an announced length alone allocates nothing.
        incoming.buffer.resize(static_cast<std::size_t>(incoming.done + piece));
        ring.read({incoming.buffer.data() + incoming.done, static_cast<std::size_t>(piece)});
      }
      incoming.done += piece;
      progressed = true;
    }
    // Released per piece, so that a frame larger than the ring streams through it.
    if (progressed) release_inbound(link);
    if (incoming.done < incoming.length) break;
    finish_frame(link);
  }
  return progressed;
}

void ShmTransport::release_inbound(Link& link) {
  link.inbound.release();
  if (link.inbound.counters().producer_waiting.load(std::memory_order_seq_cst) != 0) link.theirs.ring_bell();
}

bool ShmTransport::check_header(Link& link, const FrameHeader& header) {
  // Reported by the progress thread (check_watches), which may fail every link.
  if (header.length > max_frame_bytes_)
    link.corrupt = fmt::format("protocol error: {} wrote a frame of {} bytes into shared memory, above the limit of {}",
                               describe(link.peer), header.length, max_frame_bytes_);
  else if (header.kind == FrameKind::SingleCopy && !link.single_copy_in)
    link.corrupt = fmt::format("protocol error: {} sent a message to be read from its memory, which this rank told it "
                               "cannot be done", describe(link.peer));
  else if (header.kind == FrameKind::Acknowledgement && (header.length != 0 || header.tag != 0))
    link.corrupt = fmt::format("protocol error: {} wrote an acknowledgement frame with a tag or bytes", describe(link.peer));
  else if (header.kind != FrameKind::Inline && header.kind != FrameKind::SingleCopy && header.kind != FrameKind::Acknowledgement)
    link.corrupt = fmt::format("protocol error: {} wrote a frame of unknown kind {} into shared memory", describe(link.peer),
                               static_cast<std::uint64_t>(header.kind));
  return !link.corrupt;
}

std::optional<PeerAccessError> ShmTransport::access_outcome(const Link& link, std::optional<PeerAccessError> error) {
  // A process that ended during the access may have left its pid to another, which was reached (or refused) instead.
  if (link.process && link.process->ended()) return PeerAccessError{ESRCH, "its process has ended"};
  return error;
}

bool ShmTransport::copy_from_peer(Link& link, std::uint64_t address) {
  Incoming& incoming = *link.incoming;
  const std::uint64_t index = link.single_copies_read++;
  std::optional<PeerAccessError> error;
  if (incoming.work) {
    error = read_peer_memory(link.pid, address, {incoming.into, static_cast<std::size_t>(incoming.length)});
  } else if (!incoming.discard) {
    // Buffered: grown piece by piece, so that a length the peer's memory does not back allocates little.
    while (!error && incoming.done < incoming.length) {
      const auto piece = static_cast<std::size_t>(std::min<std::uint64_t>(kSingleCopyPiece, incoming.length - incoming.done));
      incoming.buffer.resize(static_cast<std::size_t>(incoming.done) + piece);
      error = read_peer_memory(link.pid, address + incoming.done, {incoming.buffer.data() + incoming.done, piece});
      incoming.done += piece;
    }
  }
  error = access_outcome(link, std::move(error));
  if (error) {
    link.corrupt_as = error->process_gone() ? Breakage::Lost : Breakage::Protocol;
    link.corrupt = error->process_gone()
                       ? fmt::format("lost {}: {} while this rank read a message from its memory", describe(link.peer), error->reason)
                       : fmt::format("protocol error: {} sent a message of {} bytes to be read from its memory, which failed: {}",
                                     describe(link.peer), incoming.length, error->reason);
    return false;
  }
  // Looked at after the copy: a sender withdraws a message before its send fails, after which its buffer
  // may be freed or reused, so any copy that overlapped that finds it withdrawn.
  if (index < link.inbound.counters().withdrawn.load(std::memory_order_seq_cst)) {
    if (incoming.work)
      incoming.work->fail(std::make_exception_ptr(IoError(fmt::format(
          "{} withdrew its message of {} bytes on tag {} before this rank had read it: its send failed", describe(link.peer),
          incoming.length, incoming.tag))));
    incoming.work = nullptr;
    incoming.discard = true;
    return true;  // not acknowledged: the sender waits for it no more
  }
  incoming.done = incoming.length;
  single_copy_messages_.fetch_add(1, std::memory_order_relaxed);
  const std::lock_guard lock(link.send_mutex);
  queue_frame(link, {.kind = FrameKind::Acknowledgement});
  return true;
}

bool ShmTransport::acknowledged(Link& link) {
  WorkPtr work;
  {
    const std::lock_guard lock(link.send_mutex);
    if (link.unacknowledged.empty()) {
      link.corrupt = fmt::format("protocol error: {} acknowledged a message this rank did not send it", describe(link.peer));
      return false;
    }
    work = std::move(link.unacknowledged.front());
    link.unacknowledged.pop_front();
  }
  work->complete();
  return true;
}

void ShmTransport::fail_sends(Link& link, const std::exception_ptr& error) {
  for (Outgoing& outgoing : link.queue)
    if (outgoing.work) outgoing.work->fail(error);
  link.queue.clear();
  link.queued = false;
  if (link.unacknowledged.empty()) return;
  link.outbound.counters().withdrawn.store(link.single_copies_sent, std::memory_order_seq_cst);
  for (const WorkPtr& work : link.unacknowledged) work->fail(error);
  link.unacknowledged.clear();
}

void ShmTransport::await_acknowledgements() {
  const auto until = std::chrono::steady_clock::now() + kCloseWaitForReaders;
  for (auto& link : links_) {
    const auto unread = [&] {
      const std::lock_guard lock(link->send_mutex);
      return !link->unacknowledged.empty();
    };
    while (unread() && !is_gone(*link) && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

bool ShmTransport::start_frame(Link& link, Tag tag, std::uint64_t length) {
  Incoming incoming{.tag = tag, .length = length};
  {
    const std::lock_guard lock(state_mutex_);
    const bool awaited = matcher_.first_posted(link.peer, tag) != nullptr;
    if (const std::uint64_t expected = expected_bytes_.load(std::memory_order_relaxed); !awaited && length > expected) {
      link.corrupt = fmt::format("protocol error: {} wrote a message of {} bytes on tag {} that no receive awaits into "
                                 "shared memory, above the {} bytes of this run's largest",
                                 describe(link.peer), length, tag, expected);
      return false;
    }
    if (awaited) {
      const Matcher::Receiver receiver = *matcher_.take_posted(link.peer, tag);
      if (receiver.out.size() == length) {
        incoming.into = receiver.out.data();
        incoming.work = receiver.work;
      } else {
        receiver.work->fail(size_mismatch(describe(link.peer), tag, length, receiver.out.size()));
        incoming.discard = true;
      }
    }
  }
  link.incoming = std::move(incoming);
  return true;
}

void ShmTransport::expect_messages_up_to(std::uint64_t bytes) {
  const std::uint64_t expected = expected_message_limit(bytes, max_frame_bytes_);
  expected_bytes_.store(expected, std::memory_order_relaxed);
  tcp_->expect_messages_up_to(expected);
}

void ShmTransport::finish_frame(Link& link) {
  Incoming incoming = std::move(*link.incoming);
  link.incoming.reset();
  if (incoming.discard) return;
  if (incoming.work) return incoming.work->complete();
  // Buffered: a receive posted meanwhile takes it, else it waits for one.
  const std::lock_guard lock(state_mutex_);
  matcher_.deliver(*this, link.peer, incoming.tag, std::move(incoming.buffer));
}

// ---- the progress thread

bool ShmTransport::move_bytes() {
  bool progressed = false;
  for (auto& link : links_) {
    if (!is_paired(*link)) continue;
    const std::unique_lock reading(link->read_mutex, std::try_to_lock);  // else another thread reads
    if (reading) progressed |= read_inbound(*link);
  }
  for (auto& link : links_) {
    if (!is_paired(*link) || !link->queued.load(std::memory_order_seq_cst)) continue;
    const std::unique_lock writing(link->send_mutex, std::try_to_lock);  // else another thread writes
    if (!writing || link->queue.empty()) continue;
    const std::size_t before = link->queue.front().written;
    const std::size_t queued = link->queue.size();
    write_queued(*link);
    progressed |= link->queue.size() != queued || (!link->queue.empty() && link->queue.front().written != before);
  }
  return progressed;
}

void ShmTransport::CallerPoll::begin() {
  transport_.callers_polling_.fetch_add(1, std::memory_order_seq_cst);
  transport_.caller_polls_.fetch_add(1, std::memory_order_relaxed);
}

void ShmTransport::CallerPoll::end(bool done) {
  transport_.callers_polling_.fetch_sub(1, std::memory_order_seq_cst);
  // A caller that goes on to sleep hands the bytes back to the progress thread at once. One whose operation
  // completed does not wake it (that would cost each wait a system call, and the caller its core).
  if (done) return;
  transport_.callers_sleeping_.fetch_add(1, std::memory_order_seq_cst);
  if (transport_.stepping_aside_.load(std::memory_order_seq_cst)) transport_.own_.wake_owner();
}

void ShmTransport::CallerPoll::slept() {
  transport_.callers_sleeping_.fetch_sub(1, std::memory_order_seq_cst);
}

bool ShmTransport::step_aside(std::uint64_t& polls_seen) {
  const std::uint64_t polls = caller_polls_.load(std::memory_order_relaxed);
  const bool callers_poll = callers_polling_.load(std::memory_order_seq_cst) > 0 || polls != polls_seen;
  if (!callers_poll || callers_sleeping_.load(std::memory_order_seq_cst) > 0) return false;
  polls_seen = polls;
  // Parked without announcing sleep to the peers, whose sends then ring no bell: the polling callers read.
  // A caller going to sleep either sees stepping_aside_ and rings, or is seen here and the thread stays.
  stepping_aside_.store(true, std::memory_order_seq_cst);
  const std::uint32_t seen = own_.header().bell.load(std::memory_order_seq_cst);
  if (callers_sleeping_.load(std::memory_order_seq_cst) == 0 && !stopping_.load()) {
    step_asides_.fetch_add(1, std::memory_order_relaxed);
    own_.wait_for_bell(seen, kStepAside);
  }
  stepping_aside_.store(false, std::memory_order_seq_cst);
  return true;
}

void ShmTransport::progress() {
  if (!have_mailbox_) {
    // Nothing to move: the peers' offers are answered (no shared memory) as they come.
    while (!stopping_.load()) std::this_thread::sleep_for(advance_pairings() ? kPairingLookInterval : kWatchInterval);
    return;
  }
  auto next_watch = std::chrono::steady_clock::now();
  auto last_progress = next_watch;
  MailboxHeader& own = own_.header();
  auto next_pairing_look = next_watch;
  std::uint64_t polls_seen = 0;
  while (!stopping_.load()) {
    const bool progressed = move_bytes();
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_pairing_look) {
      // Often while a pairing is under way; otherwise as often as the watches, for offers yet to come.
      next_pairing_look = now + (advance_pairings() ? kPairingLookInterval : kWatchInterval);
    }
    if (now >= next_watch) {
      check_watches();
      next_watch = now + kWatchInterval;
    }
    if (progressed) last_progress = now;
    // Idle while callers poll, or polled since the last look: they read what comes next.
    if (!progressed && step_aside(polls_seen)) continue;
    // Messages come in bursts (a collective's steps): polling a moment longer answers the next one
    // without a futex round trip.
    if (progressed || now - last_progress < kPollAfterProgress) {
      if (!progressed) std::this_thread::yield();
      continue;
    }
    // Announce the sleep (and which rings this thread waits to write into), look once more, then sleep.
    const std::uint32_t seen = own.bell.load(std::memory_order_seq_cst);
    own.sleeping.store(1, std::memory_order_seq_cst);
    std::vector<Link*> blocked;
    for (auto& link : links_) {
      if (!is_paired(*link)) continue;
      const std::lock_guard lock(link->send_mutex);
      if (link->queue.empty()) continue;
      link->outbound.counters().producer_waiting.store(1, std::memory_order_seq_cst);
      blocked.push_back(link.get());
    }
    if (!work_waiting() && !stopping_.load()) own_.wait_for_bell(seen, kWatchInterval);
    own.sleeping.store(0, std::memory_order_seq_cst);
    for (Link* link : blocked) link->outbound.counters().producer_waiting.store(0, std::memory_order_seq_cst);
  }
}

bool ShmTransport::work_waiting() {
  for (auto& link : links_) {
    if (!is_paired(*link)) continue;
    {
      const std::unique_lock reading(link->read_mutex, std::try_to_lock);
      if (reading && link->inbound.readable_bytes() > 0) return true;
    }
    if (!link->queued.load(std::memory_order_seq_cst)) continue;
    const std::lock_guard lock(link->send_mutex);
    if (link->queue.empty()) continue;
    const std::uint64_t needed = link->queue.front().header_written ? 1 : kFrameHeaderBytes;
    if (link->outbound.free_bytes() >= needed) return true;
  }
  return false;
}

bool ShmTransport::is_gone(const Link& link) const {
  const std::lock_guard lock(state_mutex_);
  return link.gone.has_value();
}

void ShmTransport::check_watches() {
  for (auto& link : links_) {
    if (!is_paired(*link)) continue;
    std::optional<std::string> corrupt;
    Breakage breakage = Breakage::Protocol;
    {
      const std::lock_guard reading(link->read_mutex);
      corrupt = link->corrupt;
      breakage = link->corrupt_as;
    }
    if (!corrupt) {
      const std::lock_guard writing(link->send_mutex);
      if (link->outbound.broken()) corrupt = broken_ring(*this, link->peer);
    }
    if (!corrupt || is_gone(*link)) continue;
    if (breakage == Breakage::Lost) {
      fail_links({link.get()}, *corrupt, breakage);
      continue;
    }
    log::error("{}: {}", describe(rank()), *corrupt);
    return fail_links(remaining_links(), *corrupt, Breakage::Protocol);
  }
  for (auto& link : links_) {
    if (!is_paired(*link) || is_gone(*link) || !link->watch->done()) continue;
    std::string reason;
    Breakage breakage = Breakage::Lost;
    try {
      link->watch->wait(std::chrono::milliseconds(0));
      reason = fmt::format("{} sent a message on a reserved tag", describe(link->peer));
      breakage = Breakage::Protocol;
    } catch (const ProtocolError& error) {
      reason = error.what();
      breakage = Breakage::Protocol;
    } catch (const TimeoutError& error) {  // the group broke: a stuck member
      reason = error.what();
      breakage = Breakage::Stuck;
    } catch (const std::exception& error) {
      reason = error.what();
    }
    // One peer gone leaves the others to finish what they share; a stuck member or broken protocol ends
    // the whole group at once, not as each watch is seen to fail.
    if (breakage == Breakage::Lost) fail_links({link.get()}, reason, breakage);
    else return fail_links(remaining_links(), reason, breakage);
  }
}

std::vector<ShmTransport::Link*> ShmTransport::remaining_links() const {
  std::vector<Link*> remaining;
  for (const auto& link : links_)
    if (is_paired(*link) && !is_gone(*link)) remaining.push_back(link.get());
  return remaining;
}

void ShmTransport::fail_links(const std::vector<Link*>& links, const std::string& reason, Breakage breakage) {
  // What the peers wrote before they went is delivered first (a peer that says goodbye has finished
  // writing). Every link is marked gone before any operation fails, so that a caller woken by one failure
  // cannot start another on a link still standing.
  for (Link* link : links) {
    const std::lock_guard reading(link->read_mutex);
    while (read_inbound(*link)) {
    }
    const std::lock_guard lock(state_mutex_);
    link->gone = reason;
    link->gone_by = breakage;
  }
  for (Link* link : links) {
    {
      const std::lock_guard reading(link->read_mutex);
      const std::lock_guard lock(state_mutex_);
      matcher_.fail_posted([&] { return error_for(link->peer); }, link->peer);
      if (link->incoming && link->incoming->work) link->incoming->work->fail(error_for(link->peer));
      link->incoming.reset();
    }
    const std::lock_guard lock(link->send_mutex);
    const std::lock_guard state(state_mutex_);
    fail_sends(*link, error_for(link->peer));
  }
}

}  // namespace shm

namespace {

// The peers of `rank` that share its host and its links.
std::vector<int> same_host_peers(const GroupOptions& options, const SharedMemoryOptions& shared_memory, int rank) {
  const int n = static_cast<int>(options.addresses.size());
  const auto host = [&](int r) {
    return shared_memory.hosts.empty() ? options.addresses[static_cast<std::size_t>(r)].host : shared_memory.hosts[static_cast<std::size_t>(r)];
  };
  std::vector<int> local;
  for (int peer = 0; peer < n; ++peer) {
    const bool linked = !options.star || rank == 0 || peer == 0;
    if (peer != rank && linked && host(peer) == host(rank)) local.push_back(peer);
  }
  return local;
}

}  // namespace

std::size_t ring_bytes_for(const SharedMemoryOptions& shared_memory, std::size_t peers) {
  constexpr std::size_t kSmallestShare = 64 * 1024, kPage = 4096;
  if (peers == 0) return shared_memory.ring_bytes;
  const std::size_t share = shared_memory.mailbox_bytes / peers / kPage * kPage;
  return std::min(shared_memory.ring_bytes, std::max(share, kSmallestShare));
}

std::unique_ptr<Transport> connect_group(const GroupOptions& options, const SharedMemoryOptions& shared_memory) {
  if (!shared_memory.hosts.empty() && shared_memory.hosts.size() != options.addresses.size())
    throw InvalidArgument(fmt::format("SharedMemoryOptions::hosts has {} labels for {} ranks", shared_memory.hosts.size(),
                                      options.addresses.size()));
  if (shared_memory.ring_bytes < 4096 || shared_memory.ring_bytes > shm::kMaxRingBytes)
    throw InvalidArgument(fmt::format("SharedMemoryOptions::ring_bytes is {}; it must be from 4096 to {} (1 GiB)",
                                      shared_memory.ring_bytes, shm::kMaxRingBytes));
  if (shared_memory.mailbox_bytes < shared_memory.ring_bytes)
    throw InvalidArgument(fmt::format("SharedMemoryOptions::mailbox_bytes is {}, less than one ring of {} bytes (ring_bytes)",
                                      shared_memory.mailbox_bytes, shared_memory.ring_bytes));
  auto tcp = connect_tcp(options);
  const std::vector<int> local = same_host_peers(options, shared_memory, options.rank);
  if (local.empty()) return tcp;
  std::vector<shm::ShmTransport::LocalPeer> peers;
  for (const int peer : local) {
    const std::vector<int> theirs = same_host_peers(options, shared_memory, peer);
    const auto your_slot = static_cast<std::uint32_t>(std::ranges::find(theirs, options.rank) - theirs.begin());
    peers.push_back({.rank = peer, .slots = static_cast<std::uint32_t>(theirs.size()), .your_slot = your_slot,
                     .ring_bytes = ring_bytes_for(shared_memory, theirs.size())});
  }
  SharedMemoryOptions settings = shared_memory;
  if (!options.single_copy) settings.single_copy_bytes = 0;
  return std::make_unique<shm::ShmTransport>(std::move(tcp), peers, ring_bytes_for(shared_memory, local.size()), settings,
                                             options.max_frame_bytes);
}

}  // namespace cohort::comm
