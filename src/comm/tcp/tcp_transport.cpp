// The TCP transport. All socket work runs on one I/O thread (Asio's io_context); send() and recv()
// post to it and return their Work handle at once.
//
// Setting up: every rank listens on its own address. A rank dials every lower rank (retrying with
// back-off, so processes may start in any order) and accepts every higher one. Each connection is
// authenticated both ways (handshake.hpp) before it carries data; a connection that fails the handshake
// is logged with its address and the reason, closed, and the listener goes on accepting. When every
// peer is connected the listener closes.
//
// Data: a frame header, then the payload. Sends are written as a scatter/gather pair (header, caller's
// bytes), so payloads are not copied; a frame whose receive is already posted is read straight into the
// caller's buffer, others are queued until their receive comes.
//
// Failures: a connection that breaks, sends a bad frame, or stays silent longer than peer_timeout
// (heartbeats keep idle links audible) makes the peer lost. The rank then fails every pending and later
// operation with IoError naming the lost peer and tells every other peer (an Abort frame), so that all
// ranks fail naming the same peer, whichever link they were waiting on. A rank that shuts down cleanly
// says goodbye first; only operations that need it fail then.
#include <asio.hpp>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "cohort/comm/tcp.hpp"
#include "cohort/core/check.hpp"
#include "cohort/core/logging.hpp"
#include "frame.hpp"
#include "handshake.hpp"

namespace cohort::comm {
namespace tcp {
namespace {

using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using Socket = std::shared_ptr<tcp::socket>;

constexpr std::chrono::milliseconds kHandshakeTimeout{10000};

struct Outgoing {
  HeaderBytes header;
  std::span<const std::byte> payload;
  WorkPtr work;  // null for control frames
};

struct Receiver {
  std::span<std::byte> out;
  WorkPtr work;
};

struct Peer {
  Socket socket;
  bool ready = false;
  bool departed = false;
  std::deque<Outgoing> queue;
  bool writing = false;
  HeaderBytes header{};
  std::vector<std::byte> payload;  // a frame with no receive posted yet
  Clock::time_point last_heard;
  std::unique_ptr<asio::steady_timer> retry;
  std::chrono::milliseconds backoff{25};
  std::string last_failure;
};

void tune(tcp::socket& socket) {
  asio::error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);
  socket.set_option(asio::socket_base::send_buffer_size(4 << 20), ignored);
  socket.set_option(asio::socket_base::receive_buffer_size(4 << 20), ignored);
}

std::string remote_of(const tcp::socket& socket) {
  asio::error_code error;
  const auto endpoint = socket.remote_endpoint(error);
  return error ? std::string("unknown address") : fmt::format("{}:{}", endpoint.address().to_string(), endpoint.port());
}

// Runs an io_context on its own thread; stops and joins it on destruction.
class IoThread {
 public:
  explicit IoThread(asio::io_context& io) : io_(io), keep_running_(io.get_executor()), thread_([&io] { io.run(); }) {}
  ~IoThread() {
    keep_running_.reset();
    io_.stop();
    thread_.join();
  }
  IoThread(const IoThread&) = delete;
  IoThread& operator=(const IoThread&) = delete;

 private:
  asio::io_context& io_;
  asio::executor_work_guard<asio::io_context::executor_type> keep_running_;
  std::thread thread_;
};

class TcpTransport : public Transport {
 public:
  explicit TcpTransport(const TcpOptions& options);
  ~TcpTransport() override;

  int rank() const override { return options_.rank; }
  // Peers this rank must be connected to before it is ready.
  int expected_peers() const { return options_.star && options_.rank != 0 ? 1 : size() - 1; }
  bool linked(int peer) const { return !options_.star || options_.rank == 0 || peer == 0; }
  int size() const override { return static_cast<int>(options_.addresses.size()); }
  std::string describe(int rank) const override { return names_.at(static_cast<std::size_t>(rank)); }
  std::chrono::milliseconds timeout() const override { return options_.timeout; }
  WorkPtr send(int peer, Tag tag, std::span<const std::byte> data) override;
  WorkPtr recv(int peer, Tag tag, std::span<std::byte> out) override;

 private:
  // setup
  void accept();
  void serve_handshake(Socket socket);
  void dial(int peer);
  void retry_dial(int peer, const std::string& reason);
  void client_handshake(int peer, Socket socket);
  void connected(int peer, Socket socket);
  // data
  void read_header(int peer);
  void on_frame(int peer, const FrameHeader& header);
  void deliver(int peer, Tag tag, std::vector<std::byte> bytes);
  void enqueue(int peer, Outgoing outgoing);
  void write_next(int peer);
  void heartbeat();
  // failures
  // protocol: the peer sent bytes that break the protocol; operations then fail with ProtocolError.
  void lose(int peer, const std::string& reason, bool protocol = false);
  void break_group(const std::string& message, bool protocol = false);
  void fail_pending_of(int peer, const std::string& message);
  void fail_queued_sends(const std::exception_ptr& error);
  void hand_over(int peer, Tag tag, const std::vector<std::byte>& bytes, const Receiver& receiver);
  std::exception_ptr broken_error() const {
    return broken_by_protocol_ ? std::make_exception_ptr(ProtocolError(*broken_)) : std::make_exception_ptr(IoError(*broken_));
  }
  void check_peer(int peer) const;

  TcpOptions options_;
  std::vector<std::string> names_;
  std::vector<tcp::endpoint> endpoints_;
  asio::io_context io_;
  tcp::acceptor acceptor_{io_};
  asio::steady_timer heartbeat_timer_{io_};
  std::vector<Peer> peers_;
  std::map<std::pair<int, Tag>, std::deque<Receiver>> receivers_;
  std::map<std::pair<int, Tag>, std::deque<std::vector<std::byte>>> unexpected_;
  std::optional<std::string> broken_;
  bool broken_by_protocol_ = false;
  Clock::time_point connect_deadline_;

  std::mutex setup_mutex_;
  std::condition_variable setup_changed_;
  int connected_ = 0;

  bool leaving_ = false;  // goodbyes sent
  bool closing_ = false;  // sockets being closed
  std::unique_ptr<IoThread> io_thread_;  // last: stopped first, before the state its handlers use
};

TcpTransport::TcpTransport(const TcpOptions& options) : options_(options) {
  const int n = size();
  COHORT_CHECK(n >= 1, "TCP transport needs at least one address");
  COHORT_CHECK(options_.rank >= 0 && options_.rank < n, "rank {} outside {} addresses", options_.rank, n);
  COHORT_CHECK(!options_.secret.empty(), "the TCP transport needs a shared secret (COHORT_SECRET or COHORT_SECRET_FILE)");
  COHORT_CHECK(options_.names.empty() || static_cast<int>(options_.names.size()) == n, "{} names for {} ranks",
               options_.names.size(), n);
  tcp::resolver resolver(io_);
  for (int r = 0; r < n; ++r) {
    const Address& a = options_.addresses[static_cast<std::size_t>(r)];
    names_.push_back(options_.names.empty() ? fmt::format("rank {} ({}:{})", r, a.host, a.port)
                                            : options_.names[static_cast<std::size_t>(r)]);
    asio::error_code error;
    const auto results = resolver.resolve(a.host, std::to_string(a.port), error);
    if (error || results.empty())
      throw InvalidArgument(fmt::format("cannot resolve {}: {}", names_.back(), error ? error.message() : "no address"));
    endpoints_.push_back(*results.begin());
  }
  peers_.resize(static_cast<std::size_t>(n));
  for (auto& peer : peers_) peer.retry = std::make_unique<asio::steady_timer>(io_);

  if (n > 1 && (!options_.star || options_.rank == 0)) {
    const auto& own = endpoints_[static_cast<std::size_t>(options_.rank)];
    asio::error_code error;
    acceptor_.open(own.protocol(), error);
    if (!error) acceptor_.set_option(tcp::acceptor::reuse_address(true), error);
    if (!error) acceptor_.bind(own, error);
    if (!error) acceptor_.listen(asio::socket_base::max_listen_connections, error);
    if (error) throw IoError(fmt::format("{} cannot listen on its address: {}", names_[static_cast<std::size_t>(options_.rank)], error.message()));
  }
  connect_deadline_ = Clock::now() + options_.connect_timeout;
  io_thread_ = std::make_unique<IoThread>(io_);
  if (n == 1) return;
  asio::post(io_, [this] {
    if (acceptor_.is_open()) accept();
    for (int peer = 0; peer < options_.rank; ++peer)
      if (linked(peer)) dial(peer);
    heartbeat();
  });

  std::unique_lock lock(setup_mutex_);
  const bool all = setup_changed_.wait_until(lock, connect_deadline_, [&] { return connected_ == expected_peers(); });
  lock.unlock();
  if (!all) {
    std::promise<std::string> missing;
    asio::post(io_, [&] {
      std::string text;
      for (int r = 0; r < n; ++r) {
        const Peer& p = peers_[static_cast<std::size_t>(r)];
        if (r == options_.rank || p.ready || !linked(r)) continue;
        text += fmt::format("{}{}{}", text.empty() ? "" : ", ", names_[static_cast<std::size_t>(r)],
                            p.last_failure.empty() ? "" : " (" + p.last_failure + ")");
      }
      missing.set_value(text);
    });
    const std::string text = missing.get_future().get();
    throw TimeoutError(fmt::format("{} could not connect within {} ms to {}", names_[static_cast<std::size_t>(options_.rank)],
                                   options_.connect_timeout.count(), text));
  }
}

TcpTransport::~TcpTransport() {
  // Say goodbye on every healthy link and give the frames a moment to leave; then close everything.
  const auto give_up = Clock::now() + std::chrono::milliseconds(500);
  bool said_goodbye = false;
  for (;;) {
    std::promise<bool> idle;
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
      bool all_idle = true;
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
    heartbeat_timer_.cancel();
    const auto error = std::make_exception_ptr(IoError("the transport was shut down"));
    fail_queued_sends(error);
    for (auto& [key, queue] : receivers_)
      for (auto& receiver : queue) receiver.work->fail(error);
    receivers_.clear();
    for (auto& p : peers_) {
      p.retry->cancel();
      if (p.socket) p.socket->close(ignored);
    }
    closed.set_value();
  });
  closed.get_future().wait();
  io_thread_.reset();
}

void TcpTransport::check_peer(int peer) const {
  COHORT_CHECK(peer >= 0 && peer < size() && peer != options_.rank && linked(peer),
               "rank {} cannot address peer {} in a {} group of {}", options_.rank, peer, options_.star ? "star" : "full", size());
}

// ---- setup

void TcpTransport::accept() {
  auto socket = std::make_shared<tcp::socket>(io_);
  acceptor_.async_accept(*socket, [this, socket](const asio::error_code& error) {
    if (error) return;  // closed
    serve_handshake(socket);
    accept();
  });
}

void TcpTransport::serve_handshake(Socket socket) {
  // Everything the handshake reads lives in one state object shared by its callbacks.
  struct State {
    HeaderBytes header{};
    std::array<std::byte, kNonceBytes + 4> hello{};
    Nonce server_nonce{};
    std::array<std::byte, kHeaderBytes + kNonceBytes + kMacBytes> challenge{};
    Mac response{};
    int client = -1;
    asio::steady_timer timer;
    explicit State(asio::io_context& io) : timer(io) {}
  };
  auto state = std::make_shared<State>(io_);
  const std::string remote = remote_of(*socket);
  auto reject = [this, socket, state, remote](const std::string& reason) {
    log::warning("{} rejected a connection from {}: {}", describe(options_.rank), remote, reason);
    asio::error_code ignored;
    socket->close(ignored);
    state->timer.cancel();
  };
  state->timer.expires_after(std::min(kHandshakeTimeout, options_.connect_timeout));
  state->timer.async_wait([socket, reject](const asio::error_code& error) {
    if (!error && socket->is_open()) reject("no complete handshake in time");
  });
  asio::async_read(*socket, asio::buffer(state->header), [this, socket, state, reject](const asio::error_code& error, std::size_t) {
    if (error) return reject("connection closed before its hello (" + error.message() + ")");
    const FrameHeader header = decode(state->header);
    if (auto problem = check(header, kNonceBytes + 4)) return reject(*problem);
    if (header.type != FrameType::Hello || header.length != kNonceBytes + 4) return reject("the first frame is not a hello");
    state->client = static_cast<int>(header.tag);
    asio::async_read(*socket, asio::buffer(state->hello), [this, socket, state, reject](const asio::error_code& error, std::size_t) {
      if (error) return reject("connection closed during its hello (" + error.message() + ")");
      std::uint32_t expected_rank = 0;
      for (int i = 0; i < 4; ++i) expected_rank |= static_cast<std::uint32_t>(state->hello[kNonceBytes + static_cast<std::size_t>(i)]) << (8 * i);
      const int client = state->client;
      if (static_cast<int>(expected_rank) != options_.rank)
        return reject(fmt::format("it wants rank {}, this is rank {}", expected_rank, options_.rank));
      if (client <= options_.rank || client >= size()) return reject(fmt::format("it claims rank {}, which does not dial rank {}", client, options_.rank));
      if (peers_[static_cast<std::size_t>(client)].ready) return reject(fmt::format("rank {} is already connected", client));
      Nonce client_nonce{};
      std::copy_n(state->hello.begin(), kNonceBytes, client_nonce.begin());
      state->server_nonce = random_nonce();
      const Mac proof = server_proof(options_.secret, client_nonce, state->server_nonce, client, options_.rank);
      const HeaderBytes header = encode({.type = FrameType::Challenge, .tag = static_cast<std::uint64_t>(options_.rank),
                                         .length = kNonceBytes + kMacBytes});
      std::copy(header.begin(), header.end(), state->challenge.begin());
      std::copy(state->server_nonce.begin(), state->server_nonce.end(), state->challenge.begin() + kHeaderBytes);
      std::copy(proof.begin(), proof.end(), state->challenge.begin() + kHeaderBytes + kNonceBytes);
      asio::async_write(*socket, asio::buffer(state->challenge), [this, socket, state, reject, client_nonce](const asio::error_code& error, std::size_t) {
        if (error) return reject("connection closed during the challenge (" + error.message() + ")");
        asio::async_read(*socket, asio::buffer(state->header), [this, socket, state, reject, client_nonce](const asio::error_code& error, std::size_t) {
          if (error) return reject("connection closed before its response (" + error.message() + ")");
          const FrameHeader header = decode(state->header);
          if (auto problem = check(header, kMacBytes)) return reject(*problem);
          if (header.type != FrameType::Response || header.length != kMacBytes) return reject("expected a response to the challenge");
          asio::async_read(*socket, asio::buffer(state->response), [this, socket, state, reject, client_nonce](const asio::error_code& error, std::size_t) {
            if (error) return reject("connection closed during its response (" + error.message() + ")");
            const Mac expected = client_proof(options_.secret, client_nonce, state->server_nonce, state->client, options_.rank);
            if (!same(expected, state->response)) return reject("it does not know the shared secret");
            if (peers_[static_cast<std::size_t>(state->client)].ready) return reject(fmt::format("rank {} is already connected", state->client));
            state->timer.cancel();
            connected(state->client, socket);
          });
        });
      });
    });
  });
}

void TcpTransport::dial(int peer) {
  auto socket = std::make_shared<tcp::socket>(io_);
  socket->async_connect(endpoints_[static_cast<std::size_t>(peer)], [this, peer, socket](const asio::error_code& error) {
    if (error) return retry_dial(peer, error.message());
    tune(*socket);
    client_handshake(peer, socket);
  });
}

void TcpTransport::retry_dial(int peer, const std::string& reason) {
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  p.last_failure = reason;
  if (Clock::now() >= connect_deadline_) return;
  // Exponential back-off from 25 ms to 1 s: quick when the peer is just starting, light when it is late.
  p.retry->expires_after(p.backoff);
  p.backoff = std::min(p.backoff * 2, std::chrono::milliseconds(1000));
  p.retry->async_wait([this, peer](const asio::error_code& error) {
    if (!error) dial(peer);
  });
}

void TcpTransport::client_handshake(int peer, Socket socket) {
  struct State {
    std::array<std::byte, kHeaderBytes + kNonceBytes + 4> hello{};
    Nonce client_nonce{};
    HeaderBytes header{};
    std::array<std::byte, kNonceBytes + kMacBytes> challenge{};
    std::array<std::byte, kHeaderBytes + kMacBytes> response{};
  };
  auto state = std::make_shared<State>();
  auto give_up = [this, peer, socket](const std::string& reason) {
    asio::error_code ignored;
    socket->close(ignored);
    retry_dial(peer, reason);
  };
  state->client_nonce = random_nonce();
  const HeaderBytes header = encode({.type = FrameType::Hello, .tag = static_cast<std::uint64_t>(options_.rank),
                                     .length = kNonceBytes + 4});
  std::copy(header.begin(), header.end(), state->hello.begin());
  std::copy(state->client_nonce.begin(), state->client_nonce.end(), state->hello.begin() + kHeaderBytes);
  for (int i = 0; i < 4; ++i)
    state->hello[kHeaderBytes + kNonceBytes + static_cast<std::size_t>(i)] = static_cast<std::byte>((static_cast<unsigned>(peer) >> (8 * i)) & 0xff);
  asio::async_write(*socket, asio::buffer(state->hello), [this, peer, socket, state, give_up](const asio::error_code& error, std::size_t) {
    if (error) return give_up("hello failed: " + error.message());
    asio::async_read(*socket, asio::buffer(state->header), [this, peer, socket, state, give_up](const asio::error_code& error, std::size_t) {
      if (error) return give_up("refused during the handshake (wrong secret?)");
      const FrameHeader header = decode(state->header);
      if (auto problem = check(header, kNonceBytes + kMacBytes)) return give_up(*problem);
      if (header.type != FrameType::Challenge || header.length != kNonceBytes + kMacBytes || static_cast<int>(header.tag) != peer)
        return give_up("the listener answered with an unexpected frame");
      asio::async_read(*socket, asio::buffer(state->challenge), [this, peer, socket, state, give_up](const asio::error_code& error, std::size_t) {
        if (error) return give_up("closed during the challenge");
        Nonce server_nonce{};
        Mac proof{};
        std::copy_n(state->challenge.begin(), kNonceBytes, server_nonce.begin());
        std::copy_n(state->challenge.begin() + kNonceBytes, kMacBytes, proof.begin());
        if (!same(proof, server_proof(options_.secret, state->client_nonce, server_nonce, options_.rank, peer))) {
          log::warning("{}: the listener at {} does not know the shared secret", describe(options_.rank), remote_of(*socket));
          return give_up("it does not know the shared secret");
        }
        const Mac answer = client_proof(options_.secret, state->client_nonce, server_nonce, options_.rank, peer);
        const HeaderBytes header = encode({.type = FrameType::Response, .length = kMacBytes});
        std::copy(header.begin(), header.end(), state->response.begin());
        std::copy(answer.begin(), answer.end(), state->response.begin() + kHeaderBytes);
        asio::async_write(*socket, asio::buffer(state->response), [this, peer, socket, state, give_up](const asio::error_code& error, std::size_t) {
          if (error) return give_up("closed during the response");
          connected(peer, socket);
        });
      });
    });
  });
}

void TcpTransport::connected(int peer, Socket socket) {
  tune(*socket);
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  p.socket = std::move(socket);
  p.ready = true;
  p.last_heard = Clock::now();
  read_header(peer);
  if (!p.queue.empty() && !p.writing) write_next(peer);
  int now_connected = 0;
  {
    const std::lock_guard lock(setup_mutex_);
    now_connected = ++connected_;
  }
  setup_changed_.notify_all();
  if (now_connected == expected_peers()) {
    asio::error_code ignored;
    acceptor_.close(ignored);  // everybody is here; nobody else gets in
  }
}

// ---- data

void TcpTransport::read_header(int peer) {
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  asio::async_read(*p.socket, asio::buffer(p.header), [this, peer](const asio::error_code& error, std::size_t) {
    Peer& q = peers_[static_cast<std::size_t>(peer)];
    if (error) {
      if (q.departed || leaving_ || closing_) return;
      return lose(peer, error == asio::error::eof ? "connection closed" : error.message());
    }
    q.last_heard = Clock::now();
    const FrameHeader header = decode(q.header);
    if (auto problem = check(header, options_.max_frame_bytes)) return lose(peer, "protocol error: " + *problem, true);
    on_frame(peer, header);
  });
}

void TcpTransport::on_frame(int peer, const FrameHeader& header) {
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  switch (header.type) {
    case FrameType::Bye:
      p.departed = true;
      return fail_pending_of(peer, fmt::format("{} left the group", describe(peer)));
    case FrameType::Heartbeat:
      return read_header(peer);
    case FrameType::Abort: {
      const auto lost = static_cast<int>(header.tag);
      const std::string lost_name = lost >= 0 && lost < size() ? describe(lost) : fmt::format("rank {}", header.tag);
      break_group(fmt::format("lost {} (reported by {})", lost_name, describe(peer)));
      return read_header(peer);
    }
    case FrameType::Data:
      break;
    default:
      return lose(peer, "protocol error: a handshake frame after the handshake", true);
  }
  const std::pair<int, Tag> key{peer, header.tag};
  auto waiting = receivers_.find(key);
  if (waiting != receivers_.end() && !waiting->second.empty() && waiting->second.front().out.size() == header.length) {
    // The receive is posted and the size fits: read straight into the caller's buffer.
    const Receiver receiver = waiting->second.front();
    waiting->second.pop_front();
    asio::async_read(*p.socket, asio::buffer(receiver.out.data(), receiver.out.size()),
                     [this, peer, receiver](const asio::error_code& error, std::size_t) {
                       if (error) {
                         receiver.work->fail(std::make_exception_ptr(IoError(fmt::format("lost {}: {}", describe(peer), error.message()))));
                         return lose(peer, error.message());
                       }
                       peers_[static_cast<std::size_t>(peer)].last_heard = Clock::now();
                       receiver.work->complete();
                       read_header(peer);
                     });
    return;
  }
  p.payload.resize(header.length);
  asio::async_read(*p.socket, asio::buffer(p.payload), [this, peer, tag = header.tag](const asio::error_code& error, std::size_t) {
    if (error) return lose(peer, error.message());
    Peer& q = peers_[static_cast<std::size_t>(peer)];
    q.last_heard = Clock::now();
    deliver(peer, tag, std::move(q.payload));
    q.payload = {};
    read_header(peer);
  });
}

void TcpTransport::deliver(int peer, Tag tag, std::vector<std::byte> bytes) {
  const std::pair<int, Tag> key{peer, tag};
  auto waiting = receivers_.find(key);
  if (waiting == receivers_.end() || waiting->second.empty()) {
    unexpected_[key].push_back(std::move(bytes));
    return;
  }
  const Receiver receiver = waiting->second.front();
  waiting->second.pop_front();
  hand_over(peer, tag, bytes, receiver);
}

void TcpTransport::hand_over(int peer, Tag tag, const std::vector<std::byte>& bytes, const Receiver& receiver) {
  if (receiver.out.size() != bytes.size()) {
    receiver.work->fail(std::make_exception_ptr(ProtocolError(fmt::format(
        "message from {} with tag {} has {} bytes, the receive expects {}", describe(peer), tag, bytes.size(), receiver.out.size()))));
    return;
  }
  if (!bytes.empty()) std::memcpy(receiver.out.data(), bytes.data(), bytes.size());
  receiver.work->complete();
}

WorkPtr TcpTransport::send(int peer, Tag tag, std::span<const std::byte> data) {
  check_peer(peer);
  auto work = std::make_shared<Work>(fmt::format("send to {}, tag {}", describe(peer), tag));
  asio::post(io_, [this, peer, tag, data, work] {
    if (broken_) return work->fail(broken_error());
    if (peers_[static_cast<std::size_t>(peer)].departed)
      return work->fail(std::make_exception_ptr(IoError(fmt::format("{} left the group", describe(peer)))));
    enqueue(peer, {encode({.type = FrameType::Data, .tag = tag, .length = data.size()}), data, work});
  });
  return work;
}

WorkPtr TcpTransport::recv(int peer, Tag tag, std::span<std::byte> out) {
  check_peer(peer);
  auto work = std::make_shared<Work>(fmt::format("recv from {}, tag {}", describe(peer), tag));
  asio::post(io_, [this, peer, tag, out, work] {
    if (broken_) return work->fail(broken_error());
    const std::pair<int, Tag> key{peer, tag};
    auto queued = unexpected_.find(key);
    if (queued != unexpected_.end() && !queued->second.empty()) {
      const std::vector<std::byte> bytes = std::move(queued->second.front());
      queued->second.pop_front();
      return hand_over(peer, tag, bytes, {out, work});
    }
    if (peers_[static_cast<std::size_t>(peer)].departed)
      return work->fail(std::make_exception_ptr(IoError(fmt::format("{} left the group", describe(peer)))));
    receivers_[key].push_back({out, work});
  });
  return work;
}

void TcpTransport::enqueue(int peer, Outgoing outgoing) {
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  p.queue.push_back(std::move(outgoing));
  if (p.ready && !p.writing) write_next(peer);
}

void TcpTransport::write_next(int peer) {
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  if (p.queue.empty() || !p.socket || !p.socket->is_open()) return;
  p.writing = true;
  const Outgoing& front = p.queue.front();
  const std::array<asio::const_buffer, 2> buffers{asio::buffer(front.header), asio::buffer(front.payload.data(), front.payload.size())};
  asio::async_write(*p.socket, buffers, [this, peer](const asio::error_code& error, std::size_t) {
    Peer& q = peers_[static_cast<std::size_t>(peer)];
    q.writing = false;
    if (q.queue.empty()) return;
    Outgoing done = std::move(q.queue.front());
    q.queue.pop_front();
    if (error) {
      if (done.work) done.work->fail(std::make_exception_ptr(IoError(fmt::format("lost {}: {}", describe(peer), error.message()))));
      if (!closing_) lose(peer, error.message());
      return;
    }
    if (done.work) done.work->complete();
    write_next(peer);
  });
}

void TcpTransport::heartbeat() {
  const auto now = Clock::now();
  for (int r = 0; r < size(); ++r) {
    Peer& p = peers_[static_cast<std::size_t>(r)];
    if (!p.ready || p.departed) continue;
    if (now - p.last_heard > options_.peer_timeout) {
      lose(r, fmt::format("silent for more than {} ms", options_.peer_timeout.count()));
      continue;
    }
    if (p.queue.empty()) enqueue(r, {encode({.type = FrameType::Heartbeat}), {}, nullptr});
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
  asio::error_code ignored;
  if (p.socket) p.socket->close(ignored);
  if (broken_) return;
  log::error("{}: lost {}: {}", describe(options_.rank), describe(peer), reason);
  for (int r = 0; r < size(); ++r) {
    const Peer& other = peers_[static_cast<std::size_t>(r)];
    if (r != peer && other.ready && !other.departed)
      enqueue(r, {encode({.type = FrameType::Abort, .tag = static_cast<std::uint64_t>(peer)}), {}, nullptr});
  }
  break_group(fmt::format("lost {}: {}", describe(peer), reason), protocol);
}

void TcpTransport::break_group(const std::string& message, bool protocol) {
  if (broken_) return;
  broken_ = message;
  broken_by_protocol_ = protocol;
  const auto error = broken_error();
  for (auto& [key, queue] : receivers_)
    for (auto& receiver : queue) receiver.work->fail(error);
  receivers_.clear();
  fail_queued_sends(error);
}

void TcpTransport::fail_queued_sends(const std::exception_ptr& error) {
  // Data frames not yet on the wire are dropped and failed, so that their callers may free the bytes;
  // the frame being written stays until its write completes, and control frames (no payload) still go.
  for (auto& p : peers_) {
    std::deque<Outgoing> kept;
    for (std::size_t i = 0; i < p.queue.size(); ++i) {
      Outgoing& outgoing = p.queue[i];
      if ((i == 0 && p.writing) || !outgoing.work) kept.push_back(std::move(outgoing));
      else outgoing.work->fail(error);
    }
    p.queue = std::move(kept);
  }
}

void TcpTransport::fail_pending_of(int peer, const std::string& message) {
  const auto error = std::make_exception_ptr(IoError(message));
  for (auto& [key, queue] : receivers_) {
    if (key.first != peer) continue;
    for (auto& receiver : queue) receiver.work->fail(error);
    queue.clear();
  }
}

}  // namespace
}  // namespace tcp

std::unique_ptr<Transport> connect_tcp(const TcpOptions& options) { return std::make_unique<tcp::TcpTransport>(options); }

std::string load_secret() {
  if (const char* secret = std::getenv("COHORT_SECRET"); secret != nullptr) {
    COHORT_CHECK(*secret != '\0', "COHORT_SECRET is empty");
    return secret;
  }
  if (const char* file = std::getenv("COHORT_SECRET_FILE"); file != nullptr) {
    std::ifstream in(file, std::ios::binary);
    COHORT_CHECK(in.good(), "COHORT_SECRET_FILE {} cannot be read", file);
    std::string secret((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
    COHORT_CHECK(!secret.empty(), "COHORT_SECRET_FILE {} is empty", file);
    return secret;
  }
  throw InvalidArgument("no shared secret: set COHORT_SECRET or COHORT_SECRET_FILE (cohort-launch sets one per run)");
}

}  // namespace cohort::comm
