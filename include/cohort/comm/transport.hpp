#pragma once
// Transport: tagged point-to-point messages between the ranks of a group. This small interface is all
// the collectives and the parameter store need; TCP (tcp.hpp) and in-process (inproc.hpp) implement it.
//
// Contract:
// - send() and recv() return at once with a Work handle (over shared memory, a pair's first one waits for
//   the pair to set up its rings, a round trip). send()'s bytes and recv()'s buffer must stay valid until
//   that handle completes.
// - Messages from one rank to another with the same tag arrive in the order they were sent; recv() takes
//   the next one, which must have exactly out.size() bytes (else ProtocolError). Different tags and
//   different peers are independent.
// - When a peer is lost, every pending and later operation of this rank fails with IoError naming the
//   lost peer (role, index, address): a group that lost a member cannot complete a collective.
// - Progress: a rank reports a count of its progress (the collectives it has started; a parameter-server
//   worker, its steps), and its peers learn the count (over TCP in its heartbeats), so that a rank that
//   waits in vain in collective K can tell a peer that never started K, alive but stuck, from the peers
//   that wait in K with it; declare_stuck() then ends the group naming it.
// - A message that arrives before its receive is posted is buffered, in pieces as its bytes come; once the
//   run has said how large its messages get (expect_messages_up_to), one announced above that is a
//   ProtocolError naming its sender at once, so that no member makes a rank buffer more than it may send.
//
//   auto s = transport.send(1, tag, std::as_bytes(std::span(values)));
//   auto r = transport.recv(1, tag, std::as_writable_bytes(std::span(incoming)));
//   s->wait(timeout);  r->wait(timeout);

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cohort/comm/work.hpp"

namespace cohort::comm {

using Tag = std::uint64_t;

// Reading a same-host peer's memory directly (Linux cross-memory attach, as Open MPI's shared-memory
// transport does), so that a collective reduces straight from its peers' buffers instead of passing their
// bytes through messages. A transport offers it only where every peer is on this host.
// Bytes of a peer's memory at `address`, and where they go in this process.
struct PeerCopy {
  std::uint64_t address = 0;
  std::span<std::byte> into;
};

class PeerMemory {
 public:
  virtual ~PeerMemory() = default;
  // Whether this rank may read and write every peer's memory (pairing first with those it has not talked
  // to: a round trip each); the kernel asks the same permission for both. Each rank answers for its own
  // access: a collective agrees with its peers before relying on it.
  virtual bool can_reach_every_peer() = 0;
  // Copies each copy's into.size() bytes at its `address` in `peer`'s process into `into`, in as few system
  // calls as the kernel allows. Throws IoError naming the peer when its process has ended, ProtocolError
  // when an address is not readable memory of that process.
  virtual void read(int peer, std::span<const PeerCopy> copies) = 0;
  void read(int peer, std::uint64_t address, std::span<std::byte> out) {
    const PeerCopy copy{.address = address, .into = out};
    read(peer, std::span(&copy, 1));
  }
  // Copies `bytes` to `address` in `peer`'s process, which must be memory the peer handed out for it, and
  // only while the peer waits for it. Throws as read() does; ProtocolError when the address is not writable
  // memory of that process.
  virtual void write(int peer, std::uint64_t address, std::span<const std::byte> bytes) = 0;
};

// Messages this small are always expected (agreements, a run's history, rendezvous answers).
inline constexpr std::uint64_t kAlwaysExpectedBytes = 256 << 10;

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual WorkPtr send(int peer, Tag tag, std::span<const std::byte> data) = 0;
  virtual WorkPtr recv(int peer, Tag tag, std::span<std::byte> out) = 0;
  // As recv(), for a message the peer may never send (an offer it makes when it first needs this rank):
  // where connections are made on demand, posting it makes none; the peer's message does.
  virtual WorkPtr recv_unprompted(int peer, Tag tag, std::span<std::byte> out) { return recv(peer, tag, out); }
  // How errors name a rank: "worker 1 (127.0.0.1:4001)".
  virtual std::string describe(int rank) const = 0;
  // The deadline that blocking helpers (collectives) apply to each wait.
  virtual std::chrono::milliseconds timeout() const = 0;

  // This rank has started `collectives` collectives (or completed that many steps) in all.
  virtual void report_progress(std::uint64_t collectives) = 0;
  // What `peer` last reported (at most a heartbeat interval old; 0 before its first report); nothing before
  // this rank has heard from it.
  virtual std::optional<std::uint64_t> progress_of(int peer) const = 0;
  // Ends the group because `peer` is stuck (alive, but making no progress): every pending and later
  // operation of this rank fails with TimeoutError(reason), and every other member's fails naming `peer`.
  virtual void declare_stuck(int peer, const std::string& reason) = 0;
  // This rank ends because of `reason`: every peer's pending and later operations fail with IoError
  // "<this rank> failed: <reason>", so that they name the cause rather than only seeing this rank leave.
  virtual void announce_failure(const std::string& reason) = 0;
  // No message of this run is larger than max(bytes, kAlwaysExpectedBytes): from now on a frame that
  // announces more while no receive of its size waits fails this rank with ProtocolError naming the sender.
  virtual void expect_messages_up_to(std::uint64_t bytes) = 0;
  // Direct reads of the peers' memory, where this transport has them for this group; none by default.
  virtual PeerMemory* peer_memory() { return nullptr; }
  // Whether collectives pass on finished blocks (an allreduce's gathering steps) in segments of their
  // segment size rather than whole, as they pass partial sums: faster over TCP, slower through shared memory.
  virtual bool gathers_in_segments() const { return false; }
  // The largest message this transport moves as one piece (a shared-memory ring's size); a larger one
  // streams through in pieces, and a collective that sends whole vectors then falls behind one that sends
  // parts of them. Unbounded by default.
  virtual std::size_t whole_message_bytes() const { return std::numeric_limits<std::size_t>::max(); }
  // Whether this rank's host has a core for each of its ranks in the group: where it has not, a round that
  // needs every rank to have spoken waits for the scheduler to run each in turn. A rank's own view (its host,
  // the cores its process may run on): other ranks may see otherwise, so collectives agree on it before
  // acting on it. A transport that cannot tell says it has.
  virtual bool ranks_have_own_cores() const { return true; }
};

// Every rank's name as `transport` describes it, for the Works of a transport built on it to name their peers.
inline RankNames rank_names(const Transport& transport) {
  std::vector<std::string> names;
  for (int rank = 0; rank < transport.size(); ++rank) names.push_back(transport.describe(rank));
  return std::make_shared<const std::vector<std::string>>(std::move(names));
}

// How the job names `rank` without its address: "worker 1" of "worker 1 (127.0.0.1:4001)".
inline std::string process_name_of(const Transport& transport, int rank) {
  const std::string described = transport.describe(rank);
  return described.substr(0, described.find(" ("));
}

}  // namespace cohort::comm
