// The TCP transport's data path (frames in and out, matching receives) and its failure handling.
#include <cstring>
#include <utility>
#include <filesystem>
#include <fstream>
#include <future>

#include "cohort/core/check.hpp"
#include "cohort/core/logging.hpp"
#include "comm/delivery.hpp"
#include "tcp_transport.hpp"

namespace cohort::comm {
namespace tcp {

TcpTransport::~TcpTransport() { shut_down(); }

void TcpTransport::shut_down() {
  // Say goodbye on every healthy link and give the frames (goodbyes, and the aborts that name a lost peer)
  // a moment to leave; then close everything.
  const auto give_up = Clock::now() + std::chrono::milliseconds(500);
  bool said_goodbye = false;
  for (;;) {
    std::promise<bool> idle;
    io_driver_->resume();
    asio::post(io_, [&] {
      if (!said_goodbye) {
        said_goodbye = true;
        leaving_ = true;  // from here on, peers closing their ends is expected
        for (int r = 0; r < size(); ++r) {
          const Peer& p = peers_[static_cast<std::size_t>(r)];
          // Peers that already left get one too: they may still be reading until their own shutdown.
          if (p.ready && p.socket->is_open() && !broken_) enqueue(r, {encode({.type = FrameType::Bye}), {}, nullptr});
        }
      }
      bool all_idle = finishing_handshakes_ == 0;
      for (const auto& p : peers_) all_idle = all_idle && !p.writing;
      idle.set_value(all_idle);
    });
    if (idle.get_future().get() || Clock::now() >= give_up) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::promise<void> closed;
  asio::post(io_, [&] {
    closing_ = true;
    asio::error_code ignored;
    acceptor_.close(ignored);
    accept_retry_.cancel();
    heartbeat_timer_.cancel();
    for (PendingHandshake& p : pending_handshakes_) p.socket->close(ignored);
    pending_handshakes_.clear();
    fail_queued_sends(shut_down_error);
    matcher_.fail_posted(shut_down_error);
    fail_adopted(shut_down_error);
    for (auto& p : peers_) {
      p.retry->cancel();
      if (p.socket) p.socket->close(ignored);
    }
    closed.set_value();
  });
  closed.get_future().wait();
  io_driver_.reset();
  // The handlers of what was cancelled (a write in flight, TLS steps) fail their operations now, on this
  // thread: no Work of this transport may be left pending, waiting on a driver that is gone.
  io_.restart();
  while (io_.poll() > 0) {
  }
}

void TcpTransport::check_peer(int peer) const {
  COHORT_CHECK(peer >= 0 && peer < size() && peer != options_.rank && linked(peer),
               "rank {} cannot address peer {} in a {} group of {}", options_.rank, peer, options_.star ? "star" : "full", size());
}

// ---- data

auto TcpTransport::noting_arrivals(int peer) {
  return [this, peer](const asio::error_code& error, std::size_t) -> std::size_t {
    if (error) return 0;
    peers_[static_cast<std::size_t>(peer)].last_heard = Clock::now();
    return kMostPerRead;
  };
}

namespace {
// Copies what was read ahead into `out`, as much as fits; returns how much.
std::size_t take_ahead(Peer& p, std::span<std::byte> out) {
  const std::size_t taken = std::min(out.size(), p.ahead_to - p.ahead_from);
  if (taken > 0) std::memcpy(out.data(), p.ahead.data() + p.ahead_from, taken);
  p.ahead_from += taken;
  return taken;
}
}  // namespace

template <typename Done>
void TcpTransport::read_exactly(int peer, std::span<std::byte> out, Done&& done) {
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  const std::size_t taken = take_ahead(p, out);
  // Called at once (a post would cost a poll of the sockets first); read_header posts, so that many frames
  // read ahead at once do not nest one handler per frame.
  if (taken == out.size()) return done(asio::error_code{});
  asio::async_read(*p.socket, asio::buffer(out.subspan(taken).data(), out.size() - taken), noting_arrivals(peer),
                   [done = std::forward<Done>(done)](const asio::error_code& error, std::size_t) mutable { done(error); });
}

void TcpTransport::read_header(int peer) {
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  auto on_header = [this, peer](const asio::error_code& error) {
    Peer& q = peers_[static_cast<std::size_t>(peer)];
    if (error) {
      if (q.departed || leaving_ || closing_) return;
      return lose(peer, error == asio::error::eof ? "connection closed" : error.message());
    }
    const FrameHeader header = decode(q.header);
    if (auto problem = check(header, options_.max_frame_bytes)) return lose(peer, "protocol error: " + *problem, true);
    on_frame(peer, header);
  };
  const std::size_t have = take_ahead(p, p.header);
  if (have == p.header.size()) return asio::post(io_, [on_header] { on_header(asio::error_code{}); });  // see read_exactly
  // The rest of the header, and whatever the socket holds after it.
  const std::size_t needed = p.header.size() - have;
  p.ahead.resize(kReadAheadBytes);
  p.ahead_from = p.ahead_to = 0;
  const auto enough = [arrivals = noting_arrivals(peer), needed](const asio::error_code& error, std::size_t transferred) {
    const std::size_t more = arrivals(error, transferred);
    return transferred >= needed ? 0 : more;
  };
  asio::async_read(*p.socket, asio::buffer(p.ahead), enough, [this, peer, have, on_header](const asio::error_code& error, std::size_t transferred) {
    Peer& q = peers_[static_cast<std::size_t>(peer)];
    q.ahead_to = error ? 0 : transferred;
    if (!error) take_ahead(q, std::span(q.header).subspan(have));
    on_header(error);
  });
}

void TcpTransport::on_frame(int peer, const FrameHeader& header) {
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  switch (header.type) {
    case FrameType::Bye:
      p.departed = true;
      if (setting_up() && set_up_with(peer))
        fail_setup(std::make_exception_ptr(IoError(fmt::format("{} could not finish set-up: {} left the group",
                                                               describe(options_.rank), describe(peer)))));
      return fail_pending_of(peer, fmt::format("{} left the group", describe(peer)));
    case FrameType::Heartbeat:
      peer_progress_[static_cast<std::size_t>(peer)].store(header.tag + 1, std::memory_order_relaxed);
      return read_header(peer);
    case FrameType::Stuck: {
      const auto stuck = static_cast<int>(header.tag);
      const std::string stuck_name = stuck >= 0 && stuck < size() ? describe(stuck) : fmt::format("rank {}", header.tag);
      if (!broken_) tell_peers(encode({.type = FrameType::Stuck, .tag = header.tag}), {}, peer);  // passed on once
      break_group(fmt::format("{} is stuck (reported by {}): connected, but it never started a collective the others waited in",
                              stuck_name, describe(peer)),
                  Breakage::Stuck);
      return read_header(peer);
    }
    case FrameType::Failed:
      return read_failure(peer, header.tag, header.length);
    case FrameType::Abort: {
      if (header.tag == static_cast<std::uint64_t>(options_.rank)) {
        // Another member broke off with this rank (their link broke, or what came over it broke the protocol).
        break_group(fmt::format("{} reports that the group lost this rank, {}: a member broke off with it", describe(peer),
                                describe(options_.rank)));
        return read_header(peer);
      }
      const auto lost = static_cast<int>(header.tag);
      const std::string lost_name = lost >= 0 && lost < size() ? describe(lost) : fmt::format("rank {}", header.tag);
      // Passed on once: a rank connected to this one but not to the reporter (not yet, in set-up, or not at
      // all, with connections on demand) would otherwise see only this rank leave, and blame it.
      if (!broken_) tell_peers(encode({.type = FrameType::Abort, .tag = header.tag}), {}, peer);
      break_group(fmt::format("lost {} (reported by {})", lost_name, describe(peer)));
      return read_header(peer);
    }
    case FrameType::Announce:
      if (header.tag > options_.max_frame_bytes)
        return lose(peer, fmt::format("protocol error: it announced frames of {} bytes, above the limit of {}", header.tag,
                                      options_.max_frame_bytes),
                    true);
      p.announced_by_peer = std::max(p.announced_by_peer, header.tag);
      return read_header(peer);
    case FrameType::Data:
      if (header.length > p.announced_by_peer)
        return lose(peer,
                    fmt::format("protocol error: a message of {} bytes on tag {}, above the {} bytes its sender announced",
                                header.length, header.tag, p.announced_by_peer),
                    true);
      break;
    default:
      return lose(peer, "protocol error: a handshake frame after the handshake", true);
  }
  if (const Matcher::Receiver* waiting = matcher_.first_posted(peer, header.tag); waiting != nullptr && waiting->out.size() == header.length)
    return read_into(peer, *matcher_.take_posted(peer, header.tag), 0);  // the receive is posted and the size fits
  if (const std::uint64_t expected = expected_bytes_.load(std::memory_order_relaxed); header.length > expected)
    return lose(peer,
                fmt::format("protocol error: a message of {} bytes on tag {} that no receive awaits, above the {} bytes of "
                            "this run's largest",
                            header.length, header.tag, expected),
                true);
  if (p.payload.capacity() == 0 && !kept_payloads_.empty()) {
    p.payload = std::move(kept_payloads_.back());
    kept_payloads_.pop_back();
  }
  p.payload.clear();
  p.unexpected = {header.tag, header.length};
  read_unexpected(peer, header.tag, header.length);
}

void TcpTransport::read_into(int peer, const Matcher::Receiver& receiver, std::size_t offset) {
  read_exactly(peer, receiver.out.subspan(offset), [this, peer, receiver](const asio::error_code& error) {
    if (error) {
      receiver.work->fail(link_error(peer, error));
      return lose(peer, error.message());
    }
    receiver.work->complete();
    read_header(peer);
  });
}

void TcpTransport::read_unexpected(int peer, Tag tag, std::uint64_t length) {
  // Grown piece by piece as the bytes come, so that a header announcing gigabytes costs memory only for what
  // the peer really sends; a peer that stops sending is lost after peer_timeout like any silent one.
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  const std::size_t have = p.payload.size();
  if (p.adopter) {
    // Its receive came while it arrived: what is here is copied once, the rest goes straight to the caller.
    const Matcher::Receiver receiver = *std::exchange(p.adopter, std::nullopt);
    p.unexpected.reset();
    if (have > 0) std::memcpy(receiver.out.data(), p.payload.data(), have);
    keep_for_reuse(std::exchange(p.payload, {}));
    return read_into(peer, receiver, have);
  }
  if (have == length) {
    p.unexpected.reset();
    matcher_.deliver(*this, peer, tag, std::exchange(p.payload, {}));
    return read_header(peer);
  }
  const std::size_t piece = static_cast<std::size_t>(std::min<std::uint64_t>(length - have, kUnexpectedPiece));
  p.payload.resize(have + piece);
  read_exactly(peer, std::span(p.payload).subspan(have, piece), [this, peer, tag, length](const asio::error_code& error) {
    if (error) {
      if (auto& adopter = peers_[static_cast<std::size_t>(peer)].adopter) {
        adopter->work->fail(link_error(peer, error));
        adopter.reset();
      }
      return lose(peer, error.message());
    }
    read_unexpected(peer, tag, length);
  });
}

void TcpTransport::keep_for_reuse(std::vector<std::byte>&& buffer) {
  if (buffer.capacity() > 0 && buffer.capacity() <= kKeptPayloadBytes && kept_payloads_.size() < kKeptPayloads)
    kept_payloads_.push_back(std::move(buffer));
}

void TcpTransport::read_failure(int peer, std::uint64_t failed, std::uint64_t length) {
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  if (length > kMaxRefusalBytes) return lose(peer, fmt::format("protocol error: a failure report of {} bytes", length), true);
  p.payload.resize(static_cast<std::size_t>(length));
  read_exactly(peer, p.payload, [this, peer, failed](const asio::error_code& error) {
    if (error) return lose(peer, error.message());
    Peer& q = peers_[static_cast<std::size_t>(peer)];
    const std::string reason(reinterpret_cast<const char*>(q.payload.data()), q.payload.size());
    q.payload = {};
    // The rank that failed, as its report says; the sender may only pass it on.
    const int rank = failed < static_cast<std::uint64_t>(size()) ? static_cast<int>(failed) : peer;
    if (!broken_) {
      failure_report_ = reason;
      tell_peers(encode({.type = FrameType::Failed, .tag = static_cast<std::uint64_t>(rank), .length = reason.size()}),
                 std::as_bytes(std::span(failure_report_)), peer);
    }
    break_group(fmt::format("{} failed: {}", describe(rank), reason));
    read_header(peer);
  });
}

WorkPtr TcpTransport::send(int peer, Tag tag, std::span<const std::byte> data) {
  check_peer(peer);
  auto work = std::make_shared<Work>(PeerOperation{"send to", names_, peer, tag}, io_driver_->poller_for(data.size()));
  asio::post(io_, [this, peer, tag, data, work] {
    if (broken_) return work->fail(broken_error());
    Peer& p = peers_[static_cast<std::size_t>(peer)];
    if (p.departed) return work->fail(std::make_exception_ptr(IoError(fmt::format("{} left the group", describe(peer)))));
    link_on_demand(peer);  // the frames wait in the queue until the link is up
    if (data.size() > p.announced_to_peer) {
      p.announced_to_peer = data.size();
      enqueue(peer, {encode({.type = FrameType::Announce, .tag = data.size()}), {}, nullptr});
    }
    enqueue(peer, {encode({.type = FrameType::Data, .tag = tag, .length = data.size()}), data, work});
  });
  return work;
}

WorkPtr TcpTransport::receive(int peer, Tag tag, std::span<std::byte> out, bool connect) {
  check_peer(peer);
  auto work = std::make_shared<Work>(PeerOperation{"recv from", names_, peer, tag}, io_driver_->poller_for(out.size()));
  asio::post(io_, [this, peer, tag, out, work, connect] {
    if (broken_) return work->fail(broken_error());
    if (std::vector<std::byte> spent; matcher_.take_buffered(*this, peer, tag, out, *work, &spent))
      return keep_for_reuse(std::move(spent));
    Peer& p = peers_[static_cast<std::size_t>(peer)];
    if (p.departed) return work->fail(std::make_exception_ptr(IoError(fmt::format("{} left the group", describe(peer)))));
    if (p.unexpected && p.unexpected->first == tag && p.unexpected->second == out.size() && !p.adopter &&
        matcher_.first_posted(peer, tag) == nullptr) {
      p.adopter = Matcher::Receiver{out, work};  // its frame is arriving: read_unexpected() hands it over
      return;
    }
    matcher_.post(peer, tag, {out, work});
    if (connect) link_on_demand(peer);
  });
  return work;
}

void TcpTransport::enqueue(int peer, Outgoing outgoing) {
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  p.queue.push_back(std::move(outgoing));
  if (p.ready && !p.writing) write_next(peer);
}

namespace {
// Up to 1 MiB per socket write (Asio's default is 64 KiB): fewer system calls on plain TCP (2 ranks, 1 MiB
// allreduce: 350 -> 243 us); a TLS stream takes its 128 KiB batch of records from each call.
std::size_t writing_pieces(const asio::error_code& error, std::size_t) { return error ? 0 : std::size_t{1} << 20; }

// Queued frames go out together, one gather write for many (a request's header and payload, a parameter
// server's shards), while what they add stays small: a large payload does not hold back the small frames
// queued after it.
constexpr std::size_t kGatherBytes = 256 << 10;
constexpr std::size_t kGatherFrames = 64;
}  // namespace

void TcpTransport::write_next(int peer) {
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  if (p.close_when_written && p.socket && p.queue.empty()) {
    p.close_when_written = false;
    return close_after_draining(peer);
  }
  if (p.queue.empty() || p.write_failed || !p.socket || !p.socket->is_open()) return;
  p.writing = true;
  p.gathered.clear();
  std::size_t frames = 0, added = 0;
  for (const Outgoing& frame : p.queue) {
    const std::size_t bytes = frame.header.size() + frame.payload.size();
    if (frames > 0 && (frames == kGatherFrames || added + bytes > kGatherBytes)) break;
    if (frames > 0) added += bytes;
    p.gathered.push_back(asio::buffer(frame.header));
    if (!frame.payload.empty()) p.gathered.push_back(asio::buffer(frame.payload.data(), frame.payload.size()));
    ++frames;
  }
  p.frames_writing = frames;
  asio::async_write(*p.socket, p.gathered, writing_pieces, [this, peer](const asio::error_code& error, std::size_t) {
    Peer& q = peers_[static_cast<std::size_t>(peer)];
    q.writing = false;
    if (q.queue.empty()) return;
    if (error && !q.departed && !broken_ && !closing_) {
      // A peer that failed first sends an Abort naming the peer it lost, then exits; a write to it can fail
      // before that Abort is read. The reader, which drains the socket, says why the connection ended and
      // fails these sends with the rest; the heartbeat deadline covers a reader that never hears.
      q.write_failed = true;
      return;
    }
    for (std::size_t f = 0; f < q.frames_writing && !q.queue.empty(); ++f) {
      Outgoing done = std::move(q.queue.front());
      q.queue.pop_front();
      if (!done.work) continue;
      if (error)
        done.work->fail(link_error(peer, error));
      else
        done.work->complete();
    }
    if (error) {
      asio::error_code ignored;
      if (q.close_when_written) q.socket->close(ignored);
      return;
    }
    write_next(peer);
  });
}

void TcpTransport::close_after_draining(int peer) {
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  asio::error_code ignored;
  p.socket->socket().shutdown(asio::socket_base::shutdown_send, ignored);
  p.payload.resize(kDrainPiece);
  p.socket->socket().async_read_some(asio::buffer(p.payload), [this, peer](const asio::error_code& error, std::size_t) {
    Peer& q = peers_[static_cast<std::size_t>(peer)];
    if (!error && !closing_) return close_after_draining(peer);
    asio::error_code ignored;
    q.socket->close(ignored);
    q.payload = {};
  });
}

void TcpTransport::heartbeat() {
  const auto now = Clock::now();
  for (int r = 0; r < size(); ++r) {
    Peer& p = peers_[static_cast<std::size_t>(r)];
    if (!p.ready || p.departed) continue;
    const auto silence = now - p.last_heard;
    if (silence > options_.peer_timeout) {
      // Bytes waiting unread mean that this rank fell behind (its I/O thread was starved of the processor),
      // not that the peer went silent: they are read next. For three timeouts at most, so that a read that
      // never comes cannot keep a dead peer.
      asio::error_code error;
      if (silence > 3 * options_.peer_timeout || p.socket->socket().available(error) == 0 || error) {
        lose(r, fmt::format("silent for more than {} ms", options_.peer_timeout.count()));
        continue;
      }
    }
    if (p.queue.empty())
      enqueue(r, {encode({.type = FrameType::Heartbeat, .tag = progress_.load(std::memory_order_relaxed)}), {}, nullptr});
  }
  heartbeat_timer_.expires_after(options_.heartbeat_interval);
  heartbeat_timer_.async_wait([this](const asio::error_code& error) {
    if (!error) heartbeat();
  });
}

// ---- failures

void TcpTransport::lose(int peer, const std::string& reason, bool protocol) {
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  if (p.departed || leaving_ || closing_) return;
  p.departed = true;
  if (protocol && !broken_ && p.socket) {
    // The peer may never have sent what arrived (a corrupting relay or network): it is told what this rank
    // received, so that it does not take the closed connection for this rank's own failure.
    p.farewell = fmt::format("what arrived from {} broke the protocol ({}): the connection between them corrupts "
                             "frames, or {} runs another build",
                             describe(peer), reason, describe(peer));
    p.farewell.resize(std::min(p.farewell.size(), kMaxRefusalBytes));
    p.close_when_written = true;
    enqueue(peer, {encode({.type = FrameType::Failed, .tag = static_cast<std::uint64_t>(options_.rank), .length = p.farewell.size()}),
                   std::as_bytes(std::span(p.farewell)), nullptr});
  } else {
    asio::error_code ignored;
    if (p.socket) p.socket->close(ignored);
  }
  if (broken_) return;
  log::error("{}: lost {}: {}", describe(options_.rank), describe(peer), reason);
  tell_peers(encode({.type = FrameType::Abort, .tag = static_cast<std::uint64_t>(peer)}), {}, peer);
  break_group(fmt::format("lost {}: {}", describe(peer), reason), protocol ? Breakage::Protocol : Breakage::Lost);
}

std::optional<std::uint64_t> TcpTransport::progress_of(int peer) const {
  check_peer(peer);
  const std::uint64_t heard = peer_progress_[static_cast<std::size_t>(peer)].load(std::memory_order_relaxed);
  if (heard == 0) return std::nullopt;
  return heard - 1;
}

void TcpTransport::declare_stuck(int peer, const std::string& reason) {
  check_peer(peer);
  asio::post(io_, [this, peer, reason] {
    if (!broken_) {
      log::error("{}: {}", describe(options_.rank), reason);
      // The stuck peer hears it too: should it wake, it learns why the group is gone.
      tell_peers(encode({.type = FrameType::Stuck, .tag = static_cast<std::uint64_t>(peer)}));
      break_group(reason, Breakage::Stuck);
    }
  });
}

void TcpTransport::announce_failure(const std::string& reason) {
  asio::post(io_, [this, reason] {
    if (broken_) return;  // the cause came from elsewhere, and the peers have heard of it
    failure_report_ = reason.substr(0, kMaxRefusalBytes);
    const auto report = std::as_bytes(std::span(failure_report_));
    tell_peers(encode({.type = FrameType::Failed, .tag = static_cast<std::uint64_t>(options_.rank), .length = report.size()}), report);
    break_group(fmt::format("{} failed: {}", describe(options_.rank), reason));
  });
}

void TcpTransport::expect_messages_up_to(std::uint64_t bytes) {
  expected_bytes_.store(expected_message_limit(bytes, options_.max_frame_bytes), std::memory_order_relaxed);
}

void TcpTransport::tell_peers(const HeaderBytes& header, std::span<const std::byte> payload, int except) {
  if (!breakage_notice_) {
    breakage_notice_ = header;
    breakage_notice_payload_.assign(payload.begin(), payload.end());
    payload = std::as_bytes(std::span(breakage_notice_payload_));  // kept while the frames are written
  }
  for (int r = 0; r < size(); ++r) {
    const Peer& other = peers_[static_cast<std::size_t>(r)];
    if (r != except && other.ready && !other.departed) enqueue(r, {header, payload, nullptr});
  }
}

void TcpTransport::break_group(const std::string& message, Breakage breakage) {
  if (broken_) return;
  broken_ = message;
  breakage_ = breakage;
  // A peer lost before everybody is connected: set-up cannot finish, and says why at once.
  if (setting_up()) {
    const std::string failure = fmt::format("{} could not finish set-up: {}", describe(options_.rank), message);
    fail_setup(breakage == Breakage::Protocol ? std::make_exception_ptr(ProtocolError(failure)) : std::make_exception_ptr(IoError(failure)));
  }
  matcher_.fail_posted([this] { return broken_error(); });
  fail_adopted([this] { return broken_error(); });
  fail_queued_sends([this] { return broken_error(); });
}

void TcpTransport::fail_adopted(const std::function<std::exception_ptr()>& error) {
  for (auto& p : peers_)
    if (p.adopter) std::exchange(p.adopter, std::nullopt)->work->fail(error());
}

void TcpTransport::fail_queued_sends(const std::function<std::exception_ptr()>& error) {
  // Data frames not yet on the wire are dropped and failed, so that their callers may free the bytes;
  // the frames being written stay where they are (the write reads their headers) until it completes, and
  // control frames (no payload) still go.
  for (auto& p : peers_) {
    const auto waiting = p.queue.begin() + static_cast<std::ptrdiff_t>(p.writing ? std::min(p.frames_writing, p.queue.size()) : 0);
    std::vector<Outgoing> control;
    for (auto it = waiting; it != p.queue.end(); ++it) {
      if (it->work) it->work->fail(error());
      else control.push_back(std::move(*it));
    }
    p.queue.erase(waiting, p.queue.end());  // at the end: the frames being written do not move
    for (Outgoing& frame : control) p.queue.push_back(std::move(frame));
  }
}

std::exception_ptr TcpTransport::link_error(int peer, const asio::error_code& error) const {
  // After the group broke (which closed the socket) the group's reason, not the socket's.
  if (broken_) return broken_error();
  return std::make_exception_ptr(IoError(fmt::format("lost {}: {}", describe(peer), error.message())));
}

void TcpTransport::fail_pending_of(int peer, const std::string& message) {
  matcher_.fail_posted([&message] { return std::make_exception_ptr(IoError(message)); }, peer);
}

}  // namespace tcp

std::unique_ptr<Transport> connect_tcp(const GroupOptions& options) { return std::make_unique<tcp::TcpTransport>(options); }

std::optional<int> connections_of(const Transport& transport) {
  const auto* tcp = dynamic_cast<const tcp::TcpTransport*>(&transport);
  if (tcp == nullptr) return std::nullopt;
  return tcp->connections();
}

std::string load_secret(const VariableLookup& variable, std::string_view source) {
  // Short enough to guess is as good as none: the HMAC handshake is only as strong as the secret.
  constexpr std::size_t kMinimumLength = 16;
  const auto secret = variable("COHORT_SECRET");
  const auto file = variable("COHORT_SECRET_FILE");
  if (secret && file)
    throw InvalidArgument("COHORT_SECRET and COHORT_SECRET_FILE are both set: set one of them, so that every process "
                          "surely uses the same secret");
  if (secret) {
    COHORT_CHECK(secret->size() >= kMinimumLength, "COHORT_SECRET has {} characters; use at least {} (e.g. openssl rand -hex 32)",
                 secret->size(), kMinimumLength);
    return *secret;
  }
  if (file) {
    std::error_code error;
    COHORT_CHECK(std::filesystem::is_regular_file(*file, error), "COHORT_SECRET_FILE {} is not a readable file", *file);
    std::ifstream in(*file, std::ios::binary);
    COHORT_CHECK(in.good(), "COHORT_SECRET_FILE {} cannot be read", *file);
    std::string read((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    while (!read.empty() && (read.back() == '\n' || read.back() == '\r')) read.pop_back();
    COHORT_CHECK(read.size() >= kMinimumLength, "COHORT_SECRET_FILE {} holds {} characters; use at least {}", *file,
                 read.size(), kMinimumLength);
    return read;
  }
  throw InvalidArgument(fmt::format("no shared secret in {}: set COHORT_SECRET or COHORT_SECRET_FILE there (cohort-launch "
                                    "sets one per run)",
                                    source));
}

std::string load_secret() {
  return load_secret([](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    return value != nullptr ? std::optional<std::string>(value) : std::nullopt;
  });
}

}  // namespace cohort::comm
