#pragma once
// TcpTransport, the implementation behind comm::connect_tcp (private to src/comm/tcp/). Setting up
// lives in tcp_connect.cpp, the data path and failure handling in tcp_transport.cpp.
//
// All socket work runs on one io_context (Asio), driven by the thread that waits on an operation or else by
// the transport's own (io_driver.hpp), one at a time; send() and recv() post to it and return their Work
// handle at once. "The I/O thread" below is whichever thread drives it.
//
// Setting up: every rank listens on its own address. With connections on demand (the default) a rank
// connects with its two ring neighbours at set-up (then waits for the ring's token, await_every_rank()),
// and dials any other peer when it first sends to or receives from it;
// either side may dial, and when both do at once (each listener sees the other's dial while its own is
// under way) the dial of the lower rank is kept and the other refused (a Crossed frame), so that both
// sides keep the same connection. Without them a rank dials every lower rank and accepts every higher
// one. Dials retry with back-off, so processes may start in any order; a peer not reached within the
// connect deadline is lost (during set-up, connect_tcp throws naming it). Each connection is
// authenticated both ways (handshake.hpp), then the listener compares the dialer's cluster list and
// deadlines with its own and accepts it (an Accepted frame) or says how they differ, before it carries data; a connection that fails the handshake
// is logged with its address and the reason, closed, and the listener goes on accepting. Both sides give
// a handshake a deadline. A listener that fails to prove the shared secret is a configuration error: the
// dialer's set-up fails at once with ProtocolError (the listener only logs the clients it refuses, so that
// a stranger cannot end a job). A peer lost (or leaving) after its handshake but before everybody is
// connected fails set-up at once too, naming it: the group cannot form without it. Handshakes in progress are capped, in total and per remote address: beyond the
// cap the oldest is dropped, so that idle connections (a flood, a scanner) can neither hold every slot nor
// every file descriptor; an accept that fails (out of descriptors) sheds the oldest and tries again with
// back-off. Rejections are logged at most once a second, with a count. When every peer is connected the
// listener closes.
//
// Data: a frame header, then the payload. Sends are written as a scatter/gather pair (header, caller's
// bytes), so payloads are not copied; a frame whose receive is already posted is read straight into the
// caller's buffer, others are queued until their receive comes (read in pieces as the bytes arrive, so that
// an announced length alone allocates nothing). Before a rank first sends a peer a frame above
// kAlwaysExpectedBytes it announces the new size (an Announce frame, in order on the same connection), so a
// data header above what its sender announced (corrupted, or injected without TLS) is refused at once,
// before the run has declared its sizes as after.
//
// Failures: a connection that breaks, sends a bad frame, or stays silent longer than peer_timeout
// (heartbeats keep idle links audible; every arrival of bytes counts, so a frame that takes longer than
// peer_timeout to cross a slow link does not) makes the peer lost. The rank then fails every pending and later
// operation with IoError naming the lost peer and tells every other peer it is connected to (an Abort
// frame), and each passes the news on once (as it does a stuck peer's, or a failed rank's report), so that
// all ranks fail naming the same peer, whichever link they were waiting on and whichever links they hold:
// the ring of set-up connects them all. A rank that shuts down cleanly says goodbye first; only operations
// that need it fail then.
#include <asio.hpp>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "cohort/comm/tcp.hpp"
#include "comm/matching.hpp"
#include "comm/delivery.hpp"
#include "frame.hpp"
#include "handshake.hpp"
#include "io_driver.hpp"
#include "stream.hpp"
#include "tls_context.hpp"

namespace cohort::comm::tcp {

using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using Socket = std::shared_ptr<Stream>;

// How many ranks' addresses name the host of rank `options.rank` (itself included), by the host as written:
// "localhost" and "127.0.0.1" count as two hosts, and the processes of other groups are not counted.
int ranks_on_own_host(const GroupOptions& options);

struct Outgoing {
  HeaderBytes header;
  std::span<const std::byte> payload;
  WorkPtr work;  // null for control frames
};

struct Peer {
  Socket socket;
  bool ready = false;
  bool departed = false;
  // Connecting: this rank dials the peer (the attempt numbered dial_attempt; older attempts' callbacks
  // close their sockets), or has decided to accept the peer's dial and is writing its acceptance.
  bool dialing = false;
  bool accepting = false;
  std::uint64_t dial_attempt = 0;
  Clock::time_point dial_deadline;
  std::deque<Outgoing> queue;
  bool writing = false;
  std::size_t frames_writing = 0;             // the queue's first frames, written by one gather write
  std::vector<asio::const_buffer> gathered;   // their headers and payloads
  bool write_failed = false;  // the reader reports why: an Abort may still be in the receive buffer
  std::string farewell;         // why this rank broke off with the peer, sent before the socket closes
  bool close_when_written = false;
  HeaderBytes header{};
  // Bytes read past a frame's header in the same socket read (its payload's start, later frames): taken
  // before the socket is read again.
  std::vector<std::byte> ahead;
  std::size_t ahead_from = 0, ahead_to = 0;
  std::vector<std::byte> payload;  // a frame with no receive posted yet
  // That frame's tag and length while it arrives; a receive of both posted meanwhile adopts it (read_unexpected).
  std::optional<std::pair<Tag, std::uint64_t>> unexpected;
  std::optional<Matcher::Receiver> adopter;
  // The largest data frame each side has announced it sends (FrameType::Announce): a frame above what its
  // sender announced is a corrupt or injected header, refused at once even before the run declares its sizes.
  std::uint64_t announced_to_peer = kAlwaysExpectedBytes;
  std::uint64_t announced_by_peer = kAlwaysExpectedBytes;
  Clock::time_point last_heard;
  std::unique_ptr<asio::steady_timer> retry;
  std::chrono::milliseconds backoff{25};
  std::string last_failure;
};

class TcpTransport : public Transport {
 public:
  explicit TcpTransport(const GroupOptions& options);
  ~TcpTransport() override;

  int rank() const override { return options_.rank; }
  // The peers this rank must be connected to before it is ready.
  bool set_up_with(int peer) const;
  // Whether this rank may talk to `peer` at all (a star's members talk to rank 0 alone).
  bool linked(int peer) const { return !options_.star || options_.rank == 0 || peer == 0; }
  // How many peers this rank holds a connection to.
  int connections() const { return connections_.load(std::memory_order_relaxed); }
  int size() const override { return static_cast<int>(options_.addresses.size()); }
  std::string describe(int rank) const override { return names_->at(static_cast<std::size_t>(rank)); }
  std::chrono::milliseconds timeout() const override { return options_.timeout; }
  void report_progress(std::uint64_t collectives) override { progress_.store(collectives, std::memory_order_relaxed); }
  std::optional<std::uint64_t> progress_of(int peer) const override;
  void declare_stuck(int peer, const std::string& reason) override;
  void expect_messages_up_to(std::uint64_t bytes) override;
  void announce_failure(const std::string& reason) override;
  WorkPtr send(int peer, Tag tag, std::span<const std::byte> data) override;
  WorkPtr recv(int peer, Tag tag, std::span<std::byte> out) override { return receive(peer, tag, out, true); }
  WorkPtr recv_unprompted(int peer, Tag tag, std::span<std::byte> out) override { return receive(peer, tag, out, false); }
  // A ring allreduce of 2 MiB on 2 ranks over loopback: 1.4-1.6x faster with its finished megabyte chunks in
  // 256 KiB messages than whole (medians of 11 and 15 alternating runs); level on 4 ranks.
  bool gathers_in_segments() const override { return true; }
  // Whether the ranks given this host's address number no more than the cores this process may run on.
  bool ranks_have_own_cores() const override { return own_cores_; }

 private:
  // setup
  void accept();
  void serve_handshake(Socket socket, const tcp::endpoint& dialer);
  // Dials `peer` now unless a connection is there or under way (on demand; the I/O thread).
  void link_on_demand(int peer);
  void start_dialing(int peer, Clock::time_point deadline);
  // Gives up this rank's dial of `peer` (both dialed, and the peer's dial is kept).
  void abandon_dial(int peer);
  // Whether attempt `attempt` is still this rank's dial of `peer`.
  bool dialing(int peer, std::uint64_t attempt) const;
  void dial(int peer, std::uint64_t attempt);
  void retry_dial(int peer, std::uint64_t attempt, const std::string& reason);
  // A dial after set-up that cannot succeed (its deadline passed, or the peer refused this rank): the peer is lost.
  void dial_failed(int peer, const std::string& reason, bool protocol);
  void client_handshake(int peer, std::uint64_t attempt, Socket socket);
  void connected(int peer, Socket socket);
  bool on_demand() const;  // connections on demand (never in a star)
  // Tells a dialer whose dial crossed this rank's own that this one is kept (a Crossed frame), then `reject`s it.
  void refuse_crossed(const Socket& socket, const std::function<void(const std::string&)>& reject);
  // Tells a dialer in plain bytes why it will never get in (a Refused frame), then `reject`s the connection.
  void refuse(const Socket& socket, const std::string& reason, const std::function<void(const std::string&)>& reject);
  // What this rank says when it dials `peer`, and the settings a listener compares with its own.
  Hello own_hello(int peer) const;
  // How a client's hello disagrees with this rank's cluster list or deadlines; empty when it does not.
  std::string settings_mismatch(const Hello& hello, int client) const;
  // A dialer reads the reason of a Refused frame of `length` bytes and gives up with it.
  static void read_refusal(const Socket& socket, std::uint64_t length, const std::function<void(const std::string&)>& cannot_join);
  std::vector<std::string> given_addresses() const;  // "host:port" per rank, as the options give them
  // Runs `then(error)` once the stream is ready for the handshake: at once for plain TCP, after the TLS
  // handshake with encryption.
  template <typename Then>
  void start_stream(const Socket& socket, asio::ssl::stream_base::handshake_type side, Then&& then);
  // Handshakes in progress on the listener, oldest first.
  struct PendingHandshake {
    Socket socket;
    std::string remote_host;
  };
  void add_pending(const Socket& socket, const std::string& remote_host);
  void remove_pending(const Socket& socket);
  void shed_oldest(const std::string* remote_host);
  void note_rejection(const std::string& remote, const std::string& reason);
  std::chrono::milliseconds handshake_timeout() const;
  // data
  // A receive; `connect`: dial the peer on demand, so that the wait has its heartbeats and its loss is noticed.
  WorkPtr receive(int peer, Tag tag, std::span<std::byte> out, bool connect);
  // A read's completion condition that marks the peer alive at every arrival, so that a frame slower to
  // arrive than peer_timeout (a slow link) does not count as silence.
  auto noting_arrivals(int peer);  // defined before its uses in tcp_transport.cpp
  // The most one socket read of a frame takes: all the socket has, in practice. Asio's default of 64 KiB
  // took four reads and four polls per 256 KiB segment (2 MiB allreduce, 2 ranks: 37 reads and 78 polls of
  // the sockets per rank; 15 and 20 with this).
  static constexpr std::size_t kMostPerRead = std::size_t{4} << 20;
  static constexpr std::size_t kDrainPiece = 64 * 1024;  // what a closing link reads at a time, to discard
  // A frame header is read with what follows it, up to this much, so that a small frame takes one read
  // instead of two (2-rank 8 KiB allreduce over loopback: 15.3 against 16.4 us, medians of 6 runs).
  static constexpr std::size_t kReadAheadBytes = 64 * 1024;
  void read_header(int peer);
  // Fills `out` from what was read ahead, then from the socket; `done(error)` runs on the I/O thread.
  template <typename Done>
  void read_exactly(int peer, std::span<std::byte> out, Done&& done);
  void on_frame(int peer, const FrameHeader& header);
  // Reads the rest of a data frame, from byte `offset` on, straight into its receive's buffer.
  void read_into(int peer, const Matcher::Receiver& receiver, std::size_t offset);
  // Reads a frame whose receive is not posted yet into the peer's payload buffer, in pieces; a receive posted
  // meanwhile takes what has come and the rest.
  static constexpr std::size_t kUnexpectedPiece = 4 << 20;
  // The buffers of such frames, once handed over, serve the next ones (up to kKeptPayloads of at most
  // kKeptPayloadBytes): a fresh buffer per frame is faulted in page by page. A ring allreduce of 2 MiB on
  // 2 ranks took in up to a megabyte of its peer's next chunk that way per call, before the receive was posted.
  static constexpr std::size_t kKeptPayloads = 4;
  static constexpr std::size_t kKeptPayloadBytes = kUnexpectedPiece;
  void keep_for_reuse(std::vector<std::byte>&& buffer);
  void read_unexpected(int peer, Tag tag, std::uint64_t length);
  // Reads the failure report of rank `failed` (`length` bytes, from `peer`) and ends the group with it.
  void read_failure(int peer, std::uint64_t failed, std::uint64_t length);
  void enqueue(int peer, Outgoing outgoing);
  // Half-closes the link to `peer` and reads what it still sends until it closes, then closes: closing
  // with its bytes unread would reset the connection, which can destroy the farewell before it is read.
  void close_after_draining(int peer);
  void write_next(int peer);
  void heartbeat();
  // failures
  // protocol: the peer sent bytes that break the protocol; operations then fail with ProtocolError.
  void lose(int peer, const std::string& reason, bool protocol = false);
  void break_group(const std::string& message, Breakage breakage = Breakage::Lost);
  void fail_pending_of(int peer, const std::string& message);
  // Fails the receives that took over an arriving message (read_unexpected), as fail_posted() does the others.
  void fail_adopted(const std::function<std::exception_ptr()>& error);
  // What an operation on `peer`'s link that failed with `error` fails with.
  std::exception_ptr link_error(int peer, const asio::error_code& error) const;
  // Each failed operation gets its own exception object: waiters on other threads rethrow them.
  void fail_queued_sends(const std::function<std::exception_ptr()>& error);
  std::exception_ptr broken_error() const { return broken_group_error(breakage_, *broken_); }
  // Sends a control frame to every connected peer but `except` (-1: none). The first one sent, which says
  // why the group broke, is kept for peers whose handshake completes after that (connected()).
  void tell_peers(const HeaderBytes& header, std::span<const std::byte> payload = {}, int except = -1);
  // Counts a handshake from the moment its peer may already hold the link for connected (the listener
  // writes its acceptance; the dialer has sent its proof) until it ends: shut_down() waits for these, so
  // that such a peer hears why this rank leaves rather than seeing the link close.
  struct FinishingHandshake {
    explicit FinishingHandshake(int& count) : count_(count) { ++count_; }
    ~FinishingHandshake() { --count_; }
    FinishingHandshake(const FinishingHandshake&) = delete;
    FinishingHandshake& operator=(const FinishingHandshake&) = delete;

   private:
    int& count_;
  };
  void check_peer(int peer) const;
  // Says goodbye, lets queued frames leave (half a second at most), closes every socket and stops the
  // I/O thread: at destruction, and before a failed set-up throws.
  void shut_down();
  // With connections on demand set-up links each rank with its ring neighbours only: a token passed twice
  // around the ring tells every rank that all have (the first lap gathers, the second releases), so that
  // no rank starts on a peer that is not up yet.
  void await_every_rank();
  // During set-up: makes connect_tcp throw `error` now instead of waiting for its deadline.
  void fail_setup(std::exception_ptr error);
  bool setting_up();

  GroupOptions options_;
  bool own_cores_ = true;
  std::unique_ptr<TlsContext> tls_;  // with encryption
  RankNames names_;
  std::vector<tcp::endpoint> endpoints_;
  std::uint64_t layout_ = 0;  // layout_fingerprint(given_addresses()), 0 in a star group
  asio::io_context io_;
  tcp::acceptor acceptor_{io_};
  asio::steady_timer accept_retry_{io_};
  std::chrono::milliseconds accept_backoff_{10};
  std::deque<PendingHandshake> pending_handshakes_;
  Clock::time_point last_rejection_log_{};
  int unlogged_rejections_ = 0;
  std::string last_rejection_;  // "from ADDRESS: reason", for the connect deadline's error
  asio::steady_timer heartbeat_timer_{io_};
  std::vector<Peer> peers_;
  Matcher matcher_;  // receives and early messages, on the I/O thread only
  std::vector<std::vector<std::byte>> kept_payloads_;  // keep_for_reuse(); the I/O thread's alone
  std::optional<std::string> broken_;
  Breakage breakage_ = Breakage::Lost;
  std::atomic<std::uint64_t> progress_{0};
  std::atomic<std::uint64_t> expected_bytes_;  // the largest frame buffered while no receive awaits it
  std::string failure_report_;  // what this rank's Failed frames carry; the I/O thread's alone
  std::optional<HeaderBytes> breakage_notice_;  // tell_peers()' first frame, and its payload
  std::vector<std::byte> breakage_notice_payload_;
  int finishing_handshakes_ = 0;  // FinishingHandshake; the I/O thread's alone
  // Per peer: 1 + the count its latest heartbeat carried, 0 before its first; written by the I/O thread alone.
  std::unique_ptr<std::atomic<std::uint64_t>[]> peer_progress_;
  Clock::time_point connect_deadline_;

  std::mutex setup_mutex_;
  std::condition_variable setup_changed_;
  int expected_peers_ = 0;  // set_up_with() them
  int connected_ = 0;       // of those
  std::atomic<int> connections_{0};
  std::exception_ptr setup_failure_;  // set-up cannot succeed: connect_tcp throws this at once

  bool leaving_ = false;  // goodbyes sent
  bool closing_ = false;  // sockets being closed
  std::unique_ptr<IoDriver> io_driver_;  // last: stopped first, before the state its handlers use
};

}  // namespace cohort::comm::tcp
