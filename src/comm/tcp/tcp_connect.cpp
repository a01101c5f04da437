// Setting up the TCP transport: listening, dialing with back-off, and both sides of the handshake.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include <future>
#include <mutex>
#include <set>

#include "cohort/core/check.hpp"
#include "cohort/core/logging.hpp"
#include "cohort/core/parallel.hpp"
#include "socket_options.hpp"
#include "tcp_transport.hpp"

namespace cohort::comm::tcp {
namespace {

constexpr std::chrono::milliseconds kHandshakeTimeout{10000};

// A process that is rank 0 of several groups (workers, parameter servers) says how they connect once.
void log_once(const std::string& line) {
  static std::mutex mutex;
  static std::set<std::string> logged;
  const std::lock_guard lock(mutex);
  if (logged.insert(line).second) log::info("{}", line);
}

}  // namespace

int ranks_on_own_host(const GroupOptions& options) {
  const std::string& host = options.addresses[static_cast<std::size_t>(options.rank)].host;
  return static_cast<int>(
      std::count_if(options.addresses.begin(), options.addresses.end(), [&](const Address& address) { return address.host == host; }));
}

TcpTransport::TcpTransport(const GroupOptions& options) : options_(options) {
  const int n = size();
  COHORT_CHECK(n >= 1, "TCP transport needs at least one address");
  COHORT_CHECK(options_.rank >= 0 && options_.rank < n, "rank {} outside {} addresses", options_.rank, n);
  COHORT_CHECK(!options_.secret.empty(), "the TCP transport needs a shared secret (COHORT_SECRET or COHORT_SECRET_FILE)");
  COHORT_CHECK(options_.names.empty() || static_cast<int>(options_.names.size()) == n, "{} names for {} ranks",
               options_.names.size(), n);
  COHORT_CHECK(options_.tls.enabled || (options_.tls.certificate.empty() && options_.tls.private_key.empty() && options_.tls.ca.empty()),
               "TLS certificates are given but TLS is not enabled");
  if (options_.tls.enabled) {
    tls_ = std::make_unique<TlsContext>(options_.tls, options_.secret);
    if (options_.rank == 0) log_once(fmt::format("connections: {}", tls_->description()));
  }
  std::vector<std::string> names;
  for (int r = 0; r < n; ++r) {
    const Address& a = options_.addresses[static_cast<std::size_t>(r)];
    names.push_back(options_.names.empty() ? fmt::format("rank {} ({}:{})", r, a.host, a.port) : options_.names[static_cast<std::size_t>(r)]);
  }
  names_ = std::make_shared<const std::vector<std::string>>(std::move(names));
  tcp::resolver resolver(io_);
  for (int r = 0; r < n; ++r) {
    const Address& a = options_.addresses[static_cast<std::size_t>(r)];
    asio::error_code error;
    const auto results = resolver.resolve(a.host, std::to_string(a.port), error);
    if (error || results.empty())
      throw InvalidArgument(fmt::format("cannot resolve {}: {}", describe(r), error ? error.message() : "no address"));
    endpoints_.push_back(*results.begin());
  }
  if (!options_.star) layout_ = layout_fingerprint(given_addresses());
  peers_.resize(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) expected_peers_ += set_up_with(r) ? 1 : 0;
  peer_progress_ = std::make_unique<std::atomic<std::uint64_t>[]>(static_cast<std::size_t>(n));
  expected_bytes_.store(options_.max_frame_bytes);
  for (auto& peer : peers_) peer.retry = std::make_unique<asio::steady_timer>(io_);

  if (n > 1 && (!options_.star || options_.rank == 0)) {
    tcp::endpoint own = endpoints_[static_cast<std::size_t>(options_.rank)];
    asio::error_code error;
    if (options_.listen_address) {
      const auto found = resolver.resolve(options_.listen_address->host, std::to_string(options_.listen_address->port), error);
      if (error || found.empty())
        throw InvalidArgument(fmt::format("cannot resolve the listen address {}:{}: {}", options_.listen_address->host,
                                          options_.listen_address->port, error ? error.message() : "no address"));
      own = *found.begin();
    }
    acceptor_.open(own.protocol(), error);
    if (!error) acceptor_.set_option(tcp::acceptor::reuse_address(true), error);
    if (!error) acceptor_.bind(own, error);
    if (!error) acceptor_.listen(asio::socket_base::max_listen_connections, error);
    if (error) throw IoError(fmt::format("{} cannot listen on its address: {}", describe(options_.rank), error.message()));
  }
  connect_deadline_ = Clock::now() + options_.connect_timeout;
  own_cores_ = ranks_on_own_host(options_) <= usable_cores();
  io_driver_ = std::make_unique<IoDriver>(io_, own_cores_);
  if (n == 1) return;
  asio::post(io_, [this] {
    if (acceptor_.is_open()) accept();
    // The higher rank of each pair dials at set-up, so that a dialer refused there knows the listener is wrong.
    for (int peer = 0; peer < options_.rank; ++peer)
      if (set_up_with(peer)) start_dialing(peer, connect_deadline_);
    heartbeat();
  });

  std::unique_lock lock(setup_mutex_);
  const bool all = setup_changed_.wait_until(
      lock, connect_deadline_, [&] { return connected_ == expected_peers_ || setup_failure_ != nullptr; });
  const std::exception_ptr failure = setup_failure_;
  lock.unlock();
  if (failure) {
    // The peers already connected learn why (an abort naming a lost peer, or a goodbye) rather than
    // seeing this process's sockets close.
    shut_down();
    std::rethrow_exception(failure);
  }
  if (!all) {
    std::promise<std::string> missing;
    io_driver_->resume();
    asio::post(io_, [&] {
      std::string text;
      int first_missing = -1;
      for (int r = 0; r < n; ++r) {
        const Peer& p = peers_[static_cast<std::size_t>(r)];
        if (!set_up_with(r) || p.ready) continue;
        if (first_missing < 0) first_missing = r;
        text += fmt::format("{}{}{}", text.empty() ? "" : ", ", describe(r),
                            p.last_failure.empty() ? "" : " (" + p.last_failure + ")");
      }
      if (!last_rejection_.empty()) text += "; the last connection refused was " + last_rejection_;
      // The peers already connected wait for the same rank: an abort naming it tells them whom the group
      // lacks, where a goodbye would make them blame this rank for leaving.
      tell_peers(encode({.type = FrameType::Abort, .tag = static_cast<std::uint64_t>(first_missing)}));
      broken_ = fmt::format("could not connect to {}", describe(first_missing));
      missing.set_value(text);
    });
    const std::string text = missing.get_future().get();
    shut_down();
    throw TimeoutError(fmt::format("{} could not connect within {} ms to {}", describe(options_.rank),
                                   options_.connect_timeout.count(), text));
  }
  if (on_demand() && expected_peers_ < n - 1) await_every_rank();
}

void TcpTransport::await_every_rank() {
  const int n = size(), r = options_.rank;
  // The neighbours of a missing rank give up at their connect deadline and name it: a moment longer here
  // lets that verdict arrive.
  const auto deadline = connect_deadline_ + std::min<std::chrono::milliseconds>(options_.connect_timeout / 2, std::chrono::seconds(5));
  std::array<std::byte, 1> token{};
  const auto await = [&](const WorkPtr& work, int peer) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (!work->wait_for(std::max(left, std::chrono::milliseconds(0))))
      throw TimeoutError(fmt::format("{} could not finish set-up within {} ms: not every rank of the group joined (it waited "
                                     "for {}, its ring neighbour, to pass on the ring's token)",
                                     describe(r), options_.connect_timeout.count(), describe(peer)));
  };
  try {
    for (int lap = 0; lap < 2; ++lap) {
      if (r != 0) await(recv((r + n - 1) % n, kSetUpTag, token), (r + n - 1) % n);
      await(send((r + 1) % n, kSetUpTag, token), (r + 1) % n);
      if (r == 0) await(recv(n - 1, kSetUpTag, token), n - 1);
    }
  } catch (...) {
    shut_down();
    throw;
  }
}

bool TcpTransport::set_up_with(int peer) const {
  if (peer == options_.rank || !linked(peer)) return false;
  if (!on_demand()) return true;
  const int n = size();
  return peer == (options_.rank + 1) % n || peer == (options_.rank + n - 1) % n;
}

// Beyond these, the oldest handshake in progress makes room (per address: from that address).
int max_pending_handshakes(int ranks) { return std::max(16, 2 * ranks); }
int max_pending_per_address(int ranks) { return std::max(8, ranks); }

// Half the connect deadline at most, so that a dialer held by a silent listener has time to try again.
std::chrono::milliseconds TcpTransport::handshake_timeout() const {
  return std::min(kHandshakeTimeout, options_.connect_timeout / 2);
}

template <typename Then>
void TcpTransport::start_stream(const Socket& socket, asio::ssl::stream_base::handshake_type side, Then&& then) {
  if (!tls_) return std::forward<Then>(then)(asio::error_code());
  if (side == asio::ssl::stream_base::client) return socket->start_tls(*tls_, side, std::forward<Then>(then));
  // A dialer without TLS opens with cohort's plain header: it gets protocol_not_supported, and a plain refusal.
  socket->socket().async_wait(tcp::socket::wait_read, [this, socket, then = std::forward<Then>(then)](const asio::error_code& error) mutable {
    if (error) return then(error);
    std::array<unsigned char, 1> first{};
    asio::error_code peek_error;
    socket->socket().receive(asio::buffer(first), tcp::socket::message_peek, peek_error);
    if (!peek_error && first[0] == static_cast<unsigned char>(kMagic & 0xff))
      return then(std::make_error_code(std::errc::protocol_not_supported));
    socket->start_tls(*tls_, asio::ssl::stream_base::server, std::move(then));
  });
}

void TcpTransport::refuse(const Socket& socket, const std::string& reason, const std::function<void(const std::string&)>& reject) {
  auto frame = std::make_shared<std::vector<std::byte>>();
  const std::string text = reason.substr(0, kMaxRefusalBytes);
  // No rank in the tag: the dialer may not have proven the secret.
  const HeaderBytes header = encode({.type = FrameType::Refused, .tag = 0, .length = text.size()});
  frame->assign(header.begin(), header.end());
  for (char c : text) frame->push_back(static_cast<std::byte>(c));
  asio::async_write(*socket, asio::buffer(*frame), [frame, reject, reason](const asio::error_code&, std::size_t) { reject(reason); });
}

Hello TcpTransport::own_hello(int peer) const {
  const auto milliseconds = [](std::chrono::milliseconds d) {
    return static_cast<std::uint32_t>(std::min<std::int64_t>(d.count(), std::numeric_limits<std::uint32_t>::max()));
  };
  return {.server_rank = static_cast<std::uint32_t>(peer), .layout = layout_,
          .heartbeat_ms = milliseconds(options_.heartbeat_interval), .peer_timeout_ms = milliseconds(options_.peer_timeout),
          .timeout_ms = milliseconds(options_.timeout)};
}

std::vector<std::string> TcpTransport::given_addresses() const {
  std::vector<std::string> given;
  for (const Address& a : options_.addresses) given.push_back(fmt::format("{}:{}", a.host, a.port));
  return given;
}

void TcpTransport::accept() {
  auto socket = std::make_shared<Stream>(io_);
  // The dialer's address as accept() returned it: a dialer that resets at once still has one to be named by.
  auto dialer = std::make_shared<tcp::endpoint>();
  acceptor_.async_accept(socket->socket(), *dialer, [this, socket, dialer](const asio::error_code& error) {
    if (!acceptor_.is_open() || error == asio::error::operation_aborted) return;  // closed
    if (error) {
      // Out of file descriptors, most likely, or a transient failure: free one and keep listening.
      note_rejection("the listener", fmt::format("accept failed ({}); retrying in {} ms", error.message(),
                                                 accept_backoff_.count()));
      shed_oldest(nullptr);
      accept_retry_.expires_after(accept_backoff_);
      accept_backoff_ = std::min(accept_backoff_ * 2, std::chrono::milliseconds(1000));
      accept_retry_.async_wait([this](const asio::error_code& error) {
        if (!error) accept();
      });
      return;
    }
    accept_backoff_ = std::chrono::milliseconds(10);
    tune_connected(socket->socket());
    serve_handshake(socket, *dialer);
    accept();
  });
}

void TcpTransport::add_pending(const Socket& socket, const std::string& remote_host) {
  int from_host = 0;
  for (const PendingHandshake& p : pending_handshakes_) from_host += p.remote_host == remote_host ? 1 : 0;
  if (from_host >= max_pending_per_address(size())) shed_oldest(&remote_host);
  if (static_cast<int>(pending_handshakes_.size()) >= max_pending_handshakes(size())) shed_oldest(nullptr);
  pending_handshakes_.push_back({socket, remote_host});
}

void TcpTransport::remove_pending(const Socket& socket) {
  for (auto it = pending_handshakes_.begin(); it != pending_handshakes_.end(); ++it)
    if (it->socket == socket) {
      pending_handshakes_.erase(it);
      return;
    }
}

// Closes the oldest handshake in progress (from `remote_host` when given); its reads then fail, and its
// handler rejects it.
void TcpTransport::shed_oldest(const std::string* remote_host) {
  for (auto it = pending_handshakes_.begin(); it != pending_handshakes_.end(); ++it) {
    if (remote_host != nullptr && it->remote_host != *remote_host) continue;
    asio::error_code ignored;
    it->socket->close(ignored);
    pending_handshakes_.erase(it);
    return;
  }
}

void TcpTransport::note_rejection(const std::string& remote, const std::string& reason) {
  last_rejection_ = fmt::format("from {}: {}", remote, reason);
  const auto now = Clock::now();
  if (now - last_rejection_log_ < std::chrono::seconds(1)) {
    ++unlogged_rejections_;
    return;
  }
  const std::string earlier =
      unlogged_rejections_ > 0 ? fmt::format(" ({} more rejected, unlogged, since the last logged)", unlogged_rejections_) : "";
  log::warning("{} rejected a connection from {}: {}{}", describe(options_.rank), remote, reason, earlier);
  last_rejection_log_ = now;
  unlogged_rejections_ = 0;
}

std::string TcpTransport::settings_mismatch(const Hello& hello, int client) const {
  if (layout_ != 0 && hello.layout != 0 && hello.layout != layout_)
    return fmt::format("its list of the group's addresses is not this rank's ({} addresses: {}): every process needs the "
                       "same cluster, in the same order",
                       size(), fmt::join(given_addresses(), ", "));
  const Hello own = own_hello(client);
  if (hello.heartbeat_ms != own.heartbeat_ms || hello.peer_timeout_ms != own.peer_timeout_ms)
    return fmt::format("it sends heartbeats every {} ms and loses a silent peer after {} ms, this rank every {} ms and after "
                       "{} ms: set COHORT_HEARTBEAT_INTERVAL and COHORT_PEER_TIMEOUT alike everywhere",
                       hello.heartbeat_ms, hello.peer_timeout_ms, own.heartbeat_ms, own.peer_timeout_ms);
  // Who is called stuck, and when, must not depend on which process judges. (Connect deadlines may differ:
  // a process started later may wait less.)
  if (hello.timeout_ms != own.timeout_ms)
    return fmt::format("it waits {} ms for a peer's progress, this rank {} ms: set COHORT_TIMEOUT alike everywhere",
                       hello.timeout_ms, own.timeout_ms);
  return {};
}

void TcpTransport::read_refusal(const Socket& socket, std::uint64_t length, const std::function<void(const std::string&)>& cannot_join) {
  // The listener says this rank's configuration is wrong: trying again cannot help.
  auto reason = std::make_shared<std::string>(length, '\0');
  asio::async_read(*socket, asio::buffer(*reason), [reason, cannot_join](const asio::error_code& error, std::size_t) {
    std::string text = error ? std::string("no reason given") : *reason;
    for (char& c : text) c = std::isprint(static_cast<unsigned char>(c)) ? c : '?';  // bytes from outside
    cannot_join(fmt::format("refused it: {}", text));
  });
}

void TcpTransport::serve_handshake(Socket socket, const tcp::endpoint& dialer) {
  // Everything the handshake reads lives in one state object shared by its callbacks.
  struct State {
    HeaderBytes header{};
    HelloBytes hello{};
    Nonce server_nonce{};
    std::array<std::byte, kHeaderBytes + kNonceBytes> challenge{};
    Mac response{};
    std::array<std::byte, kHeaderBytes + kMacBytes> acceptance{};
    int client = -1;           // the rank the dialer claims, -1 for none of the group's
    std::uint64_t claimed = 0;  // as its hello's tag says it
    Hello client_hello{};  // compared with this rank's settings once the client has proven the secret
    bool finished = false;  // rejected or connected: later callbacks of a closed socket say nothing
    asio::steady_timer timer;
    explicit State(asio::io_context& io) : timer(io) {}
  };
  auto state = std::make_shared<State>(io_);
  const std::string remote = fmt::format("{}:{}", dialer.address().to_string(), dialer.port());
  add_pending(socket, dialer.address().to_string());
  // An empty reason closes without a note: a dial that crossed this rank's own is no rejection.
  auto reject = [this, socket, state, remote](const std::string& reason) {
    if (state->finished) return;
    state->finished = true;
    if (!closing_ && !reason.empty()) note_rejection(remote, reason);
    remove_pending(socket);
    asio::error_code ignored;
    socket->close(ignored);
    state->timer.cancel();
  };
  state->timer.expires_after(handshake_timeout());
  state->timer.async_wait([socket, reject](const asio::error_code& error) {
    if (!error && socket->is_open()) reject("no complete handshake in time");
  });
  start_stream(socket, asio::ssl::stream_base::server, [this, socket, state, reject](const asio::error_code& error) {
    if (error == std::errc::protocol_not_supported)
      return refuse(socket, "this rank encrypts its connections (COHORT_TLS=1) and the dialer does not: COHORT_TLS differs "
                            "between the processes", reject);
    if (error) return reject("TLS handshake failed: " + error.message());
    asio::async_read(*socket, asio::buffer(state->header), [this, socket, state, reject](const asio::error_code& error, std::size_t) {
      // A dialer that closes before its first byte says nothing (a member whose dial became unnecessary, a scanner).
      if (error == asio::error::eof) return reject("");
      if (error) return reject("connection closed before its hello (" + error.message() + ")");
      const FrameHeader header = decode(state->header);
      if (looks_like_tls(state->header)) {
        // A TLS client: answer with a TLS alert, which it understands, so that it stops at once.
        static constexpr unsigned char kProtocolVersionAlert[] = {0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x46};
        return asio::async_write(*socket, asio::buffer(kProtocolVersionAlert), [reject](const asio::error_code&, std::size_t) {
          reject("it speaks TLS and this rank does not: COHORT_TLS differs between the processes");
        });
      }
      if (auto problem = check(header, kHelloBytes)) return reject(*problem);
      if (header.type != FrameType::Hello || header.length != kHelloBytes) return reject("the first frame is not a hello");
      // A tag beyond the group (2^32 + 1 included) is no rank at all, not one its low bits name.
      state->claimed = header.tag;
      state->client = header.tag < static_cast<std::uint64_t>(size()) ? static_cast<int>(header.tag) : -1;
      asio::async_read(*socket, asio::buffer(state->hello), [this, socket, state, reject](const asio::error_code& error, std::size_t) {
        if (error) return reject("connection closed during its hello (" + error.message() + ")");
        const Hello hello = decode_hello(state->hello);
        const std::uint32_t expected_rank = hello.server_rank;
        const int client = state->client;
        // A dialer that claims an impossible rank, or dials a rank at another's address, will never get in: it
        // is told so, so that it fails now. It has proven nothing yet, so it learns nothing of this group's
        // layout or settings: those are compared once it has proven the secret.
        auto refuse = [this, socket, reject](const std::string& reason) { this->refuse(socket, reason, reject); };
        // Before the secret is proven nothing of the group's layout goes out: not its size, not this rank.
        if (static_cast<int>(expected_rank) != options_.rank)
          return refuse(fmt::format("it dialed rank {}, which does not listen at this address (the processes' cluster "
                                    "lists differ?)",
                                    expected_rank));
        if (client < 0 || client == options_.rank || (!on_demand() && client < options_.rank) || !linked(client))
          return refuse(fmt::format("it claims rank {}, which is no rank that may dial this one (the processes' cluster "
                                    "lists differ?)",
                                    state->claimed));
        state->client_hello = hello;
        // Whether the pair is linked already is not told before the secret is proven either.
        // The dialer proves the secret first: a stranger gets a nonce and nothing computed from the secret,
        // so it cannot test guesses of a weak secret offline.
        state->server_nonce = random_nonce();
        // The tag stays 0: which rank listens here is not told before the secret is proven.
        const HeaderBytes header = encode({.type = FrameType::Challenge, .length = kNonceBytes});
        std::copy(header.begin(), header.end(), state->challenge.begin());
        std::copy(state->server_nonce.begin(), state->server_nonce.end(), state->challenge.begin() + kHeaderBytes);
        asio::async_write(*socket, asio::buffer(state->challenge), [this, socket, state, reject](const asio::error_code& error, std::size_t) {
          if (error) return reject("connection closed during the challenge (" + error.message() + ")");
          asio::async_read(*socket, asio::buffer(state->header), [this, socket, state, reject](const asio::error_code& error, std::size_t) {
            if (error) return reject("connection closed before its response (" + error.message() + ")");
            const FrameHeader header = decode(state->header);
            if (auto problem = check(header, kMacBytes)) return reject(*problem);
            if (header.type != FrameType::Response || header.length != kMacBytes) return reject("expected a response to the challenge");
            asio::async_read(*socket, asio::buffer(state->response), [this, socket, state, reject](const asio::error_code& error, std::size_t) {
              if (error) return reject("connection closed during its response (" + error.message() + ")");
              const Nonce& client_nonce = state->client_hello.nonce;
              const Mac expected = client_proof(options_.secret, client_nonce, state->server_nonce, state->client, options_.rank);
              // Telling a wrong proof apart says nothing a stranger did not know, and lets a member
              // configured with another secret fail at once instead of at its connect deadline.
              if (!same(expected, state->response))
                return this->refuse(socket, "its proof of the shared secret is wrong (COHORT_SECRET or COHORT_SECRET_FILE differ between the processes)",
                                    reject);
              Peer& peer = peers_[static_cast<std::size_t>(state->client)];
              // A member whose dial crossed a link made meanwhile (or a replay, which proves nothing): it keeps that link.
              if (peer.ready || peer.accepting) return refuse_crossed(socket, reject);
              // Only now, with the secret proven, is a member told how its settings differ from this rank's.
              if (const std::string mismatch = settings_mismatch(state->client_hello, state->client); !mismatch.empty())
                return this->refuse(socket, mismatch, reject);
              if (peer.dialing) {
                // Both dialed: the lower rank's dial is the one kept, on both sides.
                if (options_.rank < state->client) return refuse_crossed(socket, reject);
                abandon_dial(state->client);
              }
              peer.accepting = true;
              const HeaderBytes accepted = encode({.type = FrameType::Accepted, .tag = static_cast<std::uint64_t>(options_.rank),
                                                   .length = kMacBytes});
              const Mac proof = server_proof(options_.secret, client_nonce, state->server_nonce, state->client, options_.rank);
              std::copy(accepted.begin(), accepted.end(), state->acceptance.begin());
              std::copy(proof.begin(), proof.end(), state->acceptance.begin() + kHeaderBytes);
              auto finishing = std::make_shared<FinishingHandshake>(finishing_handshakes_);
              asio::async_write(*socket, asio::buffer(state->acceptance), [this, socket, state, reject, finishing](const asio::error_code& error, std::size_t) {
                peers_[static_cast<std::size_t>(state->client)].accepting = false;
                if (error) {
                  reject("connection closed before its acceptance (" + error.message() + ")");
                  // It wanted a link: this rank dials instead (a member that died meanwhile is lost at the deadline).
                  return link_on_demand(state->client);
                }
                state->finished = true;
                state->timer.cancel();
                remove_pending(socket);
                connected(state->client, socket);
              });
            });
          });
        });
      });
    });
  });
}

bool TcpTransport::on_demand() const { return options_.connect_on_demand && !options_.star; }

void TcpTransport::link_on_demand(int peer) {
  const Peer& p = peers_[static_cast<std::size_t>(peer)];
  if (!on_demand() || p.ready || p.dialing || p.accepting || p.departed || broken_ || leaving_ || closing_) return;
  start_dialing(peer, Clock::now() + options_.connect_timeout);
}

void TcpTransport::start_dialing(int peer, Clock::time_point deadline) {
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  p.dialing = true;
  p.dial_deadline = deadline;
  p.backoff = std::chrono::milliseconds(25);
  dial(peer, ++p.dial_attempt);
}

void TcpTransport::abandon_dial(int peer) {
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  p.dialing = false;
  ++p.dial_attempt;
  p.retry->cancel();
}

bool TcpTransport::dialing(int peer, std::uint64_t attempt) const {
  const Peer& p = peers_[static_cast<std::size_t>(peer)];
  return p.dialing && p.dial_attempt == attempt && !p.ready && !closing_;
}

void TcpTransport::dial(int peer, std::uint64_t attempt) {
  if (!dialing(peer, attempt)) return;
  auto socket = std::make_shared<Stream>(io_);
  socket->socket().async_connect(endpoints_[static_cast<std::size_t>(peer)], [this, peer, attempt, socket](const asio::error_code& error) {
    if (!dialing(peer, attempt)) {
      asio::error_code ignored;
      return socket->close(ignored);
    }
    if (error) return retry_dial(peer, attempt, error.message());
    tune_connected(socket->socket());
    client_handshake(peer, attempt, socket);
  });
}

void TcpTransport::retry_dial(int peer, std::uint64_t attempt, const std::string& reason) {
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  if (!dialing(peer, attempt)) return;
  p.last_failure = reason;
  if (Clock::now() >= p.dial_deadline) {
    // Set-up names the peers it lacks at its deadline; later, the group loses the peer.
    if (setting_up() && set_up_with(peer)) return;
    return dial_failed(peer, fmt::format("could not connect within {} ms ({})", options_.connect_timeout.count(), reason), false);
  }
  // Exponential back-off from 25 ms to 1 s: quick when the peer is just starting, light when it is late.
  p.retry->expires_after(p.backoff);
  p.backoff = std::min(p.backoff * 2, std::chrono::milliseconds(1000));
  p.retry->async_wait([this, peer, attempt](const asio::error_code& error) {
    if (!error) dial(peer, attempt);
  });
}

void TcpTransport::dial_failed(int peer, const std::string& reason, bool protocol) {
  abandon_dial(peer);
  lose(peer, reason, protocol);
}

void TcpTransport::refuse_crossed(const Socket& socket, const std::function<void(const std::string&)>& reject) {
  auto frame = std::make_shared<HeaderBytes>(encode({.type = FrameType::Crossed, .tag = static_cast<std::uint64_t>(options_.rank)}));
  asio::async_write(*socket, asio::buffer(*frame), [frame, reject](const asio::error_code&, std::size_t) { reject(""); });
}

void TcpTransport::client_handshake(int peer, std::uint64_t attempt, Socket socket) {
  struct State {
    std::array<std::byte, kHeaderBytes + kHelloBytes> hello{};
    Nonce client_nonce{};
    HeaderBytes header{};
    Nonce server_nonce{};
    std::array<std::byte, kHeaderBytes + kMacBytes> response{};
    Mac listener_proof{};
    bool finished = false;  // gave up or connected: later callbacks of a closed socket do nothing
    asio::steady_timer timer;
    explicit State(asio::io_context& io) : timer(io) {}
  };
  auto state = std::make_shared<State>(io_);
  auto give_up = [this, peer, attempt, socket, state](const std::string& reason) {
    if (state->finished) return;
    state->finished = true;
    state->timer.cancel();
    asio::error_code ignored;
    socket->close(ignored);
    retry_dial(peer, attempt, reason);
  };
  // The two processes' configurations disagree (secret, TLS, ranks, addresses): trying again cannot help.
  auto cannot_join = [this, peer, attempt, socket, state](const std::string& why) {
    if (state->finished) return;
    state->finished = true;
    state->timer.cancel();
    asio::error_code ignored;
    socket->close(ignored);
    if (!dialing(peer, attempt)) return;
    const std::string reason = fmt::format("{} cannot join: {} {}", describe(options_.rank), describe(peer), why);
    if (setting_up()) return fail_setup(std::make_exception_ptr(ProtocolError(reason)));
    dial_failed(peer, reason, true);
  };
  // A listener that accepts and never answers must not hold this dialer until the connect deadline.
  state->timer.expires_after(handshake_timeout());
  state->timer.async_wait([give_up, timeout = handshake_timeout()](const asio::error_code& error) {
    if (!error) give_up(fmt::format("no answer to the handshake within {} ms", timeout.count()));
  });
  state->client_nonce = random_nonce();
  const HeaderBytes header = encode({.type = FrameType::Hello, .tag = static_cast<std::uint64_t>(options_.rank),
                                     .length = kHelloBytes});
  Hello hello = own_hello(peer);
  hello.nonce = state->client_nonce;
  const HelloBytes payload = encode_hello(hello);
  std::copy(header.begin(), header.end(), state->hello.begin());
  std::copy(payload.begin(), payload.end(), state->hello.begin() + kHeaderBytes);
  start_stream(socket, asio::ssl::stream_base::client, [this, peer, attempt, socket, state, give_up, cannot_join](const asio::error_code& error) {
    if (error && error.category() != asio::error::get_ssl_category()) return give_up("TLS handshake: " + error.message());
    if (error)
      return cannot_join(fmt::format("failed the TLS handshake: {} (COHORT_TLS, the shared secret or the certificates "
                                     "differ between the processes)",
                                     error.message()));
    asio::async_write(*socket, asio::buffer(state->hello), [this, peer, attempt, socket, state, give_up, cannot_join](const asio::error_code& error, std::size_t) {
      if (error) return give_up("hello failed: " + error.message());
      asio::async_read(*socket, asio::buffer(state->header), [this, peer, attempt, socket, state, give_up, cannot_join](const asio::error_code& error, std::size_t) {
        if (error) return give_up("closed during the handshake (another secret or other settings?)");
        const FrameHeader header = decode(state->header);
        if (auto problem = check(header, std::max(kNonceBytes, kMaxRefusalBytes))) return give_up(*problem);
        if (header.type == FrameType::Refused) return read_refusal(socket, header.length, cannot_join);
        if (header.type != FrameType::Challenge || header.length != kNonceBytes)
          return give_up("the listener answered with an unexpected frame");
        asio::async_read(*socket, asio::buffer(state->server_nonce), [this, peer, attempt, socket, state, give_up, cannot_join](const asio::error_code& error, std::size_t) {
          if (error) return give_up("closed during the challenge");
          const Mac answer = client_proof(options_.secret, state->client_nonce, state->server_nonce, options_.rank, peer);
          const HeaderBytes header = encode({.type = FrameType::Response, .length = kMacBytes});
          std::copy(header.begin(), header.end(), state->response.begin());
          std::copy(answer.begin(), answer.end(), state->response.begin() + kHeaderBytes);
          asio::async_write(*socket, asio::buffer(state->response), [this, peer, attempt, socket, state, give_up, cannot_join](const asio::error_code& error, std::size_t) {
            if (error) return give_up("closed during the response");
            auto finishing = std::make_shared<FinishingHandshake>(finishing_handshakes_);
            asio::async_read(*socket, asio::buffer(state->header), [this, peer, attempt, socket, state, give_up, cannot_join, finishing](const asio::error_code& error, std::size_t) {
              if (error) return give_up("closed before accepting this rank");
              const FrameHeader header = decode(state->header);
              if (auto problem = check(header, kMaxRefusalBytes)) return give_up(*problem);
              if (header.type == FrameType::Refused) return read_refusal(socket, header.length, cannot_join);
              // The peer's own dial is kept; the back-off retry finds it connected, or dials again should it fail.
              if (header.type == FrameType::Crossed && header.length == 0) return give_up("both dialed, and the peer's dial is kept");
              if (header.type != FrameType::Accepted || header.length != kMacBytes || static_cast<int>(header.tag) != peer)
                return give_up("the listener answered the response with an unexpected frame");
              asio::async_read(*socket, asio::buffer(state->listener_proof), [this, peer, attempt, socket, state, give_up, cannot_join, finishing](const asio::error_code& error, std::size_t) {
                if (error) return give_up("closed during its acceptance");
                if (!same(state->listener_proof, server_proof(options_.secret, state->client_nonce, state->server_nonce, options_.rank, peer)))
                  return cannot_join("does not know this rank's shared secret (COHORT_SECRET or COHORT_SECRET_FILE differ between "
                                     "the processes)");
                if (state->finished) return;
                state->finished = true;
                state->timer.cancel();
                if (!dialing(peer, attempt)) {
                  asio::error_code ignored;
                  return socket->close(ignored);
                }
                connected(peer, socket);
              });
            });
          });
        });
      });
    });
  });
}

void TcpTransport::fail_setup(std::exception_ptr error) {
  const std::lock_guard lock(setup_mutex_);
  if (setup_failure_ == nullptr && connected_ < expected_peers_) setup_failure_ = std::move(error);
  setup_changed_.notify_all();
}

bool TcpTransport::setting_up() {
  const std::lock_guard lock(setup_mutex_);
  return connected_ < expected_peers_ && setup_failure_ == nullptr;
}

void TcpTransport::connected(int peer, Socket socket) {
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  p.socket = std::move(socket);
  p.ready = true;
  p.dialing = false;
  p.accepting = false;
  ++p.dial_attempt;
  p.retry->cancel();
  p.last_heard = Clock::now();
  read_header(peer);
  // A peer that completes its handshake after the group broke hears why, as the others did.
  if (breakage_notice_) p.queue.push_back({*breakage_notice_, std::as_bytes(std::span(breakage_notice_payload_)), nullptr});
  // A handshake that finished while this rank shuts down (shut_down() waits for those) hears the goodbye too.
  else if (leaving_) p.queue.push_back({encode({.type = FrameType::Bye}), {}, nullptr});
  if (!p.queue.empty() && !p.writing) write_next(peer);
  const int links = connections_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (set_up_with(peer)) {
    const std::lock_guard lock(setup_mutex_);
    ++connected_;
  }
  setup_changed_.notify_all();
  const int linkable = options_.star && options_.rank != 0 ? 1 : size() - 1;
  if (links == linkable) {
    asio::error_code ignored;
    acceptor_.close(ignored);  // everybody is here; nobody else gets in
    accept_retry_.cancel();
    while (!pending_handshakes_.empty()) shed_oldest(nullptr);
  }
}


}  // namespace cohort::comm::tcp
