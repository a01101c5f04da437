// The TCP transport: the shared conformance checks, then what only a network transport has to survive:
// peers starting in any order, wrong or missing secrets, garbage and replayed handshakes, bad frames from
// an authenticated peer, and lost peers. All traffic goes to 127.0.0.1.
#include <arpa/inet.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <poll.h>
#include <optional>
#include <thread>

#include "cohort/comm/tcp.hpp"
#include "cohort/core/parallel.hpp"
#include "comm/tcp/frame.hpp"
#include "comm/tcp/handshake.hpp"
#include "comm/tcp/socket_options.hpp"
#include "comm/tcp/tcp_transport.hpp"
#include "comm/tcp/tls_context.hpp"
#include "conformance.hpp"

using namespace cohort;
using namespace cohort::comm;
using namespace std::chrono_literals;

namespace {

const std::string kSecret = "a shared secret for tests";

GroupOptions options_for(int rank, const std::vector<Address>& addresses, std::string secret = kSecret) {
  return comm_test::tcp_options(rank, addresses, 3s, std::move(secret));
}

// A rank's set-up on a thread of its own, for the tests where set-up must fail: `error` is what it ended with.
std::thread failing_set_up(GroupOptions options, std::exception_ptr& error) {
  return std::thread([options = std::move(options), &error] {
    try {
      connect_tcp(options);
    } catch (...) {
      error = std::current_exception();
    }
  });
}

// Connects n ranks concurrently, as n processes would; `adjust` changes every rank's options.
std::vector<std::unique_ptr<Transport>> connect_group(int n, const std::vector<Address>& addresses,
                                                      const std::function<void(GroupOptions&)>& adjust = {}) {
  std::vector<std::unique_ptr<Transport>> transports(static_cast<std::size_t>(n));
  comm_test::run_ranks(n, [&](int r) {
    GroupOptions options = options_for(r, addresses);
    if (adjust) adjust(options);
    transports[static_cast<std::size_t>(r)] = connect_tcp(options);
  });
  return transports;
}

void with_tls(GroupOptions& options) { options.tls.enabled = true; }

// The test certificates (tests/comm/tls/README.md): `node` for node.pem, node.key and ca.pem.
std::function<void(GroupOptions&)> with_certificates(const std::string& node, const std::string& ca = "ca") {
  return [=](GroupOptions& options) {
    const std::string dir = COHORT_TEST_SOURCE_DIR "/comm/tls/";
    options.tls = {.enabled = true, .certificate = dir + node + ".pem", .private_key = dir + node + ".key", .ca = dir + ca + ".pem"};
  };
}

// A raw TCP client for feeding the listener bytes of our choosing.
class RawClient {
 public:
  explicit RawClient(const Address& address) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in target{};
    target.sin_family = AF_INET;
    target.sin_port = htons(address.port);
    ::inet_pton(AF_INET, address.host.c_str(), &target.sin_addr);
    for (int attempt = 0; attempt < 200; ++attempt) {
      if (::connect(fd_, reinterpret_cast<sockaddr*>(&target), sizeof target) == 0) return;
      std::this_thread::sleep_for(20ms);
    }
    FAIL("cannot connect to the listener");
  }
  ~RawClient() { ::close(fd_); }
  void write(const void* data, std::size_t size) { CHECK(::send(fd_, data, size, MSG_NOSIGNAL) == static_cast<ssize_t>(size)); }
  template <typename Bytes>
  void write(const Bytes& bytes) { write(bytes.data(), bytes.size()); }
  // Reads exactly `size` bytes; false when the peer closes first.
  bool read(void* data, std::size_t size) {
    timeval timeout{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    std::size_t done = 0;
    while (done < size) {
      const ssize_t got = ::recv(fd_, static_cast<char*>(data) + done, size - done, 0);
      if (got <= 0) return false;
      done += static_cast<std::size_t>(got);
    }
    return true;
  }
  // True when the listener has closed the connection.
  bool closed_by_peer() {
    char byte;
    return !read(&byte, 1);
  }

 private:
  int fd_;
};

// A hello as a rank of the group at `addresses` would send it, with options_for()'s deadlines.
std::vector<std::byte> hello_frame(int client_rank, const tcp::Nonce& nonce, int server_rank,
                                   const std::vector<Address>& addresses, std::chrono::milliseconds peer_timeout = 3s) {
  std::vector<std::string> endpoints;
  for (const auto& a : addresses) endpoints.push_back(fmt::format("{}:{}", a.host, a.port));
  const tcp::HelloBytes payload = tcp::encode_hello({.nonce = nonce, .server_rank = static_cast<std::uint32_t>(server_rank),
                                                     .layout = tcp::layout_fingerprint(endpoints), .heartbeat_ms = 100,
                                                     .peer_timeout_ms = static_cast<std::uint32_t>(peer_timeout.count()),
                                                     .timeout_ms = 10000});
  const auto header = tcp::encode({.type = tcp::FrameType::Hello, .tag = static_cast<std::uint64_t>(client_rank), .length = tcp::kHelloBytes});
  std::vector<std::byte> out(header.begin(), header.end());
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

std::vector<std::byte> response_frame(const tcp::Mac& proof) {
  const auto header = tcp::encode({.type = tcp::FrameType::Response, .length = tcp::kMacBytes});
  std::vector<std::byte> out(header.begin(), header.end());
  out.insert(out.end(), proof.begin(), proof.end());
  return out;
}

// Runs the client side of the handshake by hand; returns the server nonce (or nothing when refused, or
// when the listener's proof of the secret is wrong).
std::optional<tcp::Nonce> handshake(RawClient& client, int client_rank, const std::string& secret, const tcp::Nonce& nonce,
                                    const std::vector<Address>& addresses, int server_rank = 0,
                                    std::chrono::milliseconds peer_timeout = 3s) {
  client.write(hello_frame(client_rank, nonce, server_rank, addresses, peer_timeout));
  tcp::HeaderBytes header{};
  tcp::Nonce server{};
  if (!client.read(header.data(), header.size()) || !client.read(server.data(), server.size())) return std::nullopt;
  client.write(response_frame(tcp::client_proof(secret, nonce, server, client_rank, server_rank)));
  tcp::Mac proof{};
  if (!client.read(header.data(), header.size()) || tcp::decode(header).type != tcp::FrameType::Accepted ||
      !client.read(proof.data(), proof.size()) || !tcp::same(proof, tcp::server_proof(secret, nonce, server, client_rank, server_rank)))
    return std::nullopt;
  return server;
}

// A plain listening socket at `address`, standing where a rank of the group would listen.
int raw_listener(const Address& address) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in own{};
  own.sin_family = AF_INET;
  own.sin_port = htons(address.port);
  ::inet_pton(AF_INET, address.host.c_str(), &own.sin_addr);
  const int reuse = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &reuse, sizeof reuse);
  REQUIRE(::bind(fd, reinterpret_cast<const sockaddr*>(&own), sizeof own) == 0);
  REQUIRE(::listen(fd, 16) == 0);
  return fd;
}

// Reads a Refused frame, which must come next, and returns its reason.
std::string refusal_of(RawClient& client) {
  tcp::HeaderBytes header{};
  REQUIRE(client.read(header.data(), header.size()));
  const tcp::FrameHeader refusal = tcp::decode(header);
  REQUIRE(refusal.type == tcp::FrameType::Refused);
  REQUIRE(refusal.length <= tcp::kMaxRefusalBytes);
  std::string reason(refusal.length, '\0');
  REQUIRE(client.read(reason.data(), reason.size()));
  return reason;
}

// The legitimate rank 1 joins rank 0, whose connect_tcp runs on `listener`, and a message goes through.
void legitimate_peer_still_works(std::thread& listener, std::unique_ptr<Transport>& zero,
                                 const std::vector<Address>& addresses) {
  auto one = connect_tcp(options_for(1, addresses));
  listener.join();
  std::vector<int> ping{5}, pong(1);
  auto sent = one->send(0, 1, conformance::bytes(ping));
  zero->recv(1, 1, conformance::bytes(pong))->wait(5s);
  sent->wait(5s);
  CHECK(pong[0] == 5);
}

// Rank 0 of a 2-rank group whose rank 1 is `peer`, a raw client that has passed the handshake.
std::unique_ptr<Transport> zero_with_raw_peer(std::unique_ptr<RawClient>& peer, const std::vector<Address>& addresses,
                                              std::uint64_t max_frame_bytes = GroupOptions{}.max_frame_bytes) {
  std::unique_ptr<Transport> zero;
  std::thread listener([&] {
    auto options = options_for(0, addresses);
    options.max_frame_bytes = max_frame_bytes;
    zero = connect_tcp(options);
  });
  peer = std::make_unique<RawClient>(addresses[0]);
  const bool accepted = handshake(*peer, 1, kSecret, tcp::random_nonce(), addresses).has_value();
  listener.join();
  REQUIRE(accepted);
  return zero;
}

}  // namespace

TEST_CASE("tcp: the conformance checks", "[comm][tcp]") {
  {
    const auto addresses = comm_test::free_addresses(3);
    auto group = connect_group(3, addresses);
    conformance::ordering_and_tags(conformance::members_of(group));
  }
  {
    const auto addresses = comm_test::free_addresses(2);
    auto group = connect_group(2, addresses);
    conformance::sizes_and_mismatch(conformance::members_of(group));
  }
}

TEST_CASE("tcp: heartbeats carry each rank's progress, and a rank declared stuck is named by all", "[comm][tcp]") {
  const auto addresses = comm_test::free_addresses(3);
  conformance::progress_and_stuck(conformance::members_of(connect_group(3, addresses)));
}

TEST_CASE("tcp: a rank that announces its failure is named with its reason by all", "[comm][tcp]") {
  const auto addresses = comm_test::free_addresses(3);
  conformance::failure_announced(conformance::members_of(connect_group(3, addresses)));
}

TEST_CASE("tcp: a message larger than the run expects, which no receive awaits, is refused at once", "[comm][tcp][security]") {
  const auto addresses = comm_test::free_addresses(2);
  conformance::unexpected_messages_bounded(conformance::members_of(connect_group(2, addresses)));
}

TEST_CASE("tcp: collectives match the serial reference on 1 to 4 ranks", "[comm][tcp][collectives]") {
  for (int n : {1, 2, 3, 4}) {
    const auto addresses = comm_test::free_addresses(n);
    auto group = connect_group(n, addresses);
    conformance::allreduce_matches_reference(conformance::members_of(group), {0, 1, static_cast<std::size_t>(n > 1 ? n - 1 : 0), 7, 1000, 300001});
    conformance::allreduce_bfloat16_wire(conformance::members_of(group), {0, 1, 7, 1001, 30001});
    conformance::reduce_scatter_then_allgather(conformance::members_of(group), {0, 1, 7, 75001});
    conformance::broadcast_allgather_barrier(conformance::members_of(group));
    // Every rank is on this host: a core each while they number no more than the cores (the ring's
    // segments follow, collectives.cpp).
    for (const auto& transport : group) CHECK(transport->ranks_have_own_cores() == (n <= usable_cores()));
    if (n == 2) {  // both send the vector once by default: in one exchange below 4 MiB, in two halves from there
      CHECK(allreduce_algorithm(*group[0], (std::size_t{4} << 20) - 4) == "recursive doubling");
      CHECK(allreduce_algorithm(*group[0], std::size_t{4} << 20) == "ring");
    }
  }
}

TEST_CASE("tcp: processes may start in any order", "[comm][tcp]") {
  const auto addresses = comm_test::free_addresses(3);
  std::vector<std::unique_ptr<Transport>> group(3);
  comm_test::run_ranks(3, [&](int r) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300 * (2 - r)));  // rank 2 first, rank 0 last
    group[static_cast<std::size_t>(r)] = connect_tcp(options_for(r, addresses));
  });
  conformance::broadcast_allgather_barrier(conformance::members_of(group));
}

TEST_CASE("tcp: a missing peer is a TimeoutError naming it, no secret is refused at once", "[comm][tcp]") {
  const auto addresses = comm_test::free_addresses(2);
  auto options = options_for(1, addresses);
  options.connect_timeout = 500ms;
  CHECK_THROWS_WITH(connect_tcp(options), Catch::Contains("chief 0") && Catch::Contains("500 ms"));
  CHECK_THROWS_AS(connect_tcp(options_for(0, addresses, "")), InvalidArgument);
}

TEST_CASE("tcp: a wrong secret is refused while the legitimate peers carry on", "[comm][tcp][security]") {
  const auto addresses = comm_test::free_addresses(2);
  std::unique_ptr<Transport> zero;
  std::thread listener([&] { zero = connect_tcp(options_for(0, addresses)); });
  auto intruder = options_for(1, addresses, "not the secret");
  intruder.connect_timeout = 10s;
  const auto started = std::chrono::steady_clock::now();
  // A wrong secret is a configuration error: the dialer fails at once, naming the listener, not at its deadline.
  CHECK_THROWS_AS(connect_tcp(intruder), ProtocolError);
  CHECK(std::chrono::steady_clock::now() - started < 3s);
  CHECK_THROWS_WITH(connect_tcp(intruder), Catch::Contains("chief 0") && Catch::Contains("proof of the shared secret is wrong"));
  legitimate_peer_still_works(listener, zero, addresses);
}

TEST_CASE("tcp: a listener that cannot prove the secret is refused by the dialer at once", "[comm][tcp][security]") {
  // An impostor at rank 0's address: it challenges the dialer as the real rank would, then accepts it
  // with a proof made without the secret.
  const auto addresses = comm_test::free_addresses(2);
  const int listening = raw_listener(addresses[0]);
  std::thread impostor([&] {
    const int fd = ::accept(listening, nullptr, nullptr);
    std::array<std::byte, tcp::kHeaderBytes + tcp::kHelloBytes> hello{};
    std::array<std::byte, tcp::kHeaderBytes + tcp::kMacBytes> response{};
    ::recv(fd, hello.data(), hello.size(), MSG_WAITALL);
    const auto challenge_header = tcp::encode({.type = tcp::FrameType::Challenge, .tag = 0, .length = tcp::kNonceBytes});
    const tcp::Nonce nonce = tcp::random_nonce();
    ::send(fd, challenge_header.data(), challenge_header.size(), MSG_NOSIGNAL);
    ::send(fd, nonce.data(), nonce.size(), MSG_NOSIGNAL);
    ::recv(fd, response.data(), response.size(), MSG_WAITALL);
    const auto accepted = tcp::encode({.type = tcp::FrameType::Accepted, .tag = 0, .length = tcp::kMacBytes});
    const tcp::Mac guessed{};
    ::send(fd, accepted.data(), accepted.size(), MSG_NOSIGNAL);
    ::send(fd, guessed.data(), guessed.size(), MSG_NOSIGNAL);
    char byte = 0;
    ::recv(fd, &byte, 1, 0);  // until the dialer hangs up
    ::close(fd);
  });
  auto dialer = options_for(1, addresses);
  dialer.connect_timeout = 10s;
  const auto started = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(connect_tcp(dialer), Catch::Contains("chief 0") && Catch::Contains("does not know this rank's shared secret"));
  CHECK(std::chrono::steady_clock::now() - started < 3s);
  impostor.join();
  ::close(listening);
}

TEST_CASE("tcp: garbage, truncated and replayed handshakes are refused and change nothing", "[comm][tcp][security]") {
  const auto addresses = comm_test::free_addresses(2);
  std::unique_ptr<Transport> zero;
  std::thread listener([&] { zero = connect_tcp(options_for(0, addresses)); });
  {
    RawClient garbage(addresses[0]);
    std::vector<unsigned char> noise(100);
    for (std::size_t i = 0; i < noise.size(); ++i) noise[i] = static_cast<unsigned char>(i * 37 + 11);
    garbage.write(noise);
    CHECK(garbage.closed_by_peer());
  }
  {
    RawClient http(addresses[0]);
    const std::string request = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    http.write(request);
    CHECK(http.closed_by_peer());
  }
  {
    RawClient truncated(addresses[0]);
    const auto hello = hello_frame(1, tcp::random_nonce(), 0, addresses);
    truncated.write(hello.data(), 30);  // half a hello, then silence until the client gives up
  }
  {
    RawClient oversized(addresses[0]);
    const auto header = tcp::encode({.type = tcp::FrameType::Hello, .tag = 1, .length = std::uint64_t{1} << 40});
    oversized.write(header);
    CHECK(oversized.closed_by_peer());
  }
  {
    // A handshake recorded for an earlier server nonce, replayed against a fresh one.
    const tcp::Nonce client = tcp::random_nonce(), old_server = tcp::random_nonce();
    const auto recorded_response = response_frame(tcp::client_proof(kSecret, client, old_server, 1, 0));
    RawClient replay(addresses[0]);
    replay.write(hello_frame(1, client, 0, addresses));
    std::array<std::byte, tcp::kHeaderBytes + tcp::kNonceBytes> challenge{};
    REQUIRE(replay.read(challenge.data(), challenge.size()));
    replay.write(recorded_response);
    CHECK_THAT(refusal_of(replay), Catch::Contains("proof of the shared secret is wrong"));
    CHECK(replay.closed_by_peer());
  }
  {
    RawClient future(addresses[0]);  // a peer speaking another protocol version
    auto hello = hello_frame(1, tcp::random_nonce(), 0, addresses);
    auto header = tcp::decode(*reinterpret_cast<const tcp::HeaderBytes*>(hello.data()));
    header.version = tcp::kProtocolVersion + 1;
    const auto encoded = tcp::encode(header);
    std::copy(encoded.begin(), encoded.end(), hello.begin());
    future.write(hello);
    CHECK(future.closed_by_peer());
  }
  {
    RawClient wrong_rank(addresses[0]);
    wrong_rank.write(hello_frame(0, tcp::random_nonce(), 0, addresses));  // rank 0 never dials rank 0
    // Told why, then closed; before it proves the secret, nothing of the layout (the group's size, the listener's rank).
    const std::string refusal = refusal_of(wrong_rank);
    CHECK_THAT(refusal, Catch::Contains("claims rank 0"));
    CHECK_THAT(refusal, !Catch::Contains("group of") && !Catch::Contains("above 0"));
    CHECK(wrong_rank.closed_by_peer());
  }
  {
    // A rank whose low 32 bits name a member (2^32 + 1) is no member.
    RawClient wide_rank(addresses[0]);
    auto hello = hello_frame(1, tcp::random_nonce(), 0, addresses);
    auto header = tcp::decode(*reinterpret_cast<const tcp::HeaderBytes*>(hello.data()));
    header.tag = (std::uint64_t{1} << 32) + 1;
    const auto encoded = tcp::encode(header);
    std::copy(encoded.begin(), encoded.end(), hello.begin());
    wide_rank.write(hello);
    CHECK_THAT(refusal_of(wide_rank), Catch::Contains("claims rank 4294967297, which is no rank that may dial this one"));
    CHECK(wide_rank.closed_by_peer());
  }
  legitimate_peer_still_works(listener, zero, addresses);
}

// Opens `count` idle connections to `address` from a child process (which only makes system calls, so it
// is safe to fork here) and keeps them open until it is killed.
class IdleFlood {
 public:
  IdleFlood(const Address& address, int count) : child_(::fork()) {
    REQUIRE(child_ >= 0);
    if (child_ > 0) return;
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives the test, however it ends
    sockaddr_in target{};
    target.sin_family = AF_INET;
    target.sin_port = htons(address.port);
    ::inet_pton(AF_INET, "127.0.0.1", &target.sin_addr);
    for (int i = 0; i < count; ++i) {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      if (fd >= 0) ::connect(fd, reinterpret_cast<const sockaddr*>(&target), sizeof target);
    }
    for (;;) ::pause();
  }
  ~IdleFlood() {
    ::kill(child_, SIGKILL);
    ::waitpid(child_, nullptr, 0);
  }
  IdleFlood(const IdleFlood&) = delete;
  IdleFlood& operator=(const IdleFlood&) = delete;

 private:
  pid_t child_;
};

// Lowers this process's open-file limit to `headroom` descriptors above those open now; restores it.
class DescriptorLimit {
 public:
  explicit DescriptorLimit(int headroom) {
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &original_) == 0);
    int open_now = 0;
    for (int fd = 0; fd < 4096; ++fd) open_now += ::fcntl(fd, F_GETFD) != -1 ? 1 : 0;
    rlimit tight = original_;
    tight.rlim_cur = static_cast<rlim_t>(open_now + headroom);
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &tight) == 0);
  }
  ~DescriptorLimit() { ::setrlimit(RLIMIT_NOFILE, &original_); }
  DescriptorLimit(const DescriptorLimit&) = delete;
  DescriptorLimit& operator=(const DescriptorLimit&) = delete;

 private:
  rlimit original_{};
};

TEST_CASE("tcp: idle connections beyond the open-file limit do not stop the group from forming", "[comm][tcp][security]") {
  // The listener's process may hold only a few more descriptors than it does now, and 300 connections that
  // never say hello arrive before the legitimate peer: the listener must shed them and keep accepting.
  const auto addresses = comm_test::free_addresses(2);
  auto zero_options = options_for(0, addresses), one_options = options_for(1, addresses);
  zero_options.connect_timeout = one_options.connect_timeout = 30s;
  std::unique_ptr<Transport> zero;
  std::exception_ptr listener_failed;
  std::thread listener([&] {
    try {
      zero = connect_tcp(zero_options);
    } catch (...) {
      listener_failed = std::current_exception();
    }
  });
  std::this_thread::sleep_for(200ms);  // listening
  const auto started = std::chrono::steady_clock::now();
  {
    IdleFlood flood(addresses[0], 300);
    std::this_thread::sleep_for(300ms);  // the flood is queued at the listener
    std::unique_ptr<Transport> one;
    {
      const DescriptorLimit limit(12);
      // This process shares the limit with the listener: when the peer's own set-up finds no descriptor
      // free, it tries again (that is the harness, not what is tested).
      for (int attempt = 0; !one; ++attempt) {
        try {
          one = connect_tcp(one_options);
        } catch (const std::exception& e) {
          const bool no_descriptor = std::string(e.what()).find("open files") != std::string::npos;
          if (!no_descriptor || attempt == 50) {
            listener.join();
            throw;
          }
          std::this_thread::sleep_for(100ms);
        }
      }
    }
    listener.join();
    if (listener_failed) std::rethrow_exception(listener_failed);
    std::vector<int> ping{7}, pong(1);
    auto sent = one->send(0, 1, conformance::bytes(ping));
    zero->recv(1, 1, conformance::bytes(pong))->wait(5s);
    sent->wait(5s);
    CHECK(pong[0] == 7);
  }
  CHECK(std::chrono::steady_clock::now() - started < 25s);
}

TEST_CASE("tcp: a listener that accepts and never answers does not hold a dialer until the deadline", "[comm][tcp][security]") {
  const auto addresses = comm_test::free_addresses(2);
  // A silent listener on rank 0's address.
  const int silent = raw_listener(addresses[0]);
  auto one = options_for(1, addresses);
  one.connect_timeout = 3s;  // each handshake may then take 1.5 s: the error names the silent listener and why
  CHECK_THROWS_WITH(connect_tcp(one), Catch::Contains("chief 0") && Catch::Contains("no answer to the handshake within 1500 ms"));
  ::close(silent);
}

TEST_CASE("tcp: bad frames from an authenticated peer fail operations with ProtocolError", "[comm][tcp][security]") {
  for (int variant = 0; variant < 4; ++variant) {
    std::unique_ptr<RawClient> raw;
    const auto zero = zero_with_raw_peer(raw, comm_test::free_addresses(2), 1 << 20);
    RawClient& peer = *raw;
    std::vector<int> out(4);
    auto pending = zero->recv(1, 1, conformance::bytes(out));
    if (variant == 0) {
      peer.write(tcp::encode({.type = tcp::FrameType::Data, .tag = 1, .length = std::uint64_t{1} << 30}));  // above the limit
    } else if (variant == 1) {
      std::vector<unsigned char> noise(24, 0xAB);
      peer.write(noise);
    } else if (variant == 2) {
      peer.write(tcp::encode({.type = tcp::FrameType::Hello, .tag = 1, .length = 0}));  // a handshake frame again
    } else {
      peer.write(tcp::encode({.type = tcp::FrameType::Heartbeat, .tag = 1, .length = 4096}));  // a heartbeat has no body
    }
    INFO("variant " << variant);
    CHECK_THROWS_AS(pending->wait(5s), ProtocolError);
    CHECK_THROWS_WITH(zero->send(1, 1, conformance::bytes(out))->wait(5s), Catch::Contains("worker 1"));
    // The peer may never have sent those bytes (a corrupting relay): it is told what arrived, then closed,
    // so that it does not blame rank 0 for a connection that merely closed.
    std::string farewell;
    for (tcp::HeaderBytes header{}; farewell.empty() && peer.read(header.data(), header.size());) {
      const tcp::FrameHeader frame = tcp::decode(header);
      REQUIRE(frame.length <= tcp::kMaxRefusalBytes);
      std::string payload(static_cast<std::size_t>(frame.length), '\0');
      REQUIRE(peer.read(payload.data(), payload.size()));
      if (frame.type == tcp::FrameType::Failed) farewell = payload;
    }
    CHECK_THAT(farewell, Catch::Contains("what arrived from worker 1") && Catch::Contains("broke the protocol"));
    CHECK(peer.closed_by_peer());
  }
}

TEST_CASE("tcp: a rank that breaks off over a bad frame reads on until the peer closes, so its farewell arrives",
          "[comm][tcp][security]") {
  // Closing with the peer's bytes unread would reset the connection, and a reset can destroy the farewell
  // before the peer reads it.
  std::unique_ptr<RawClient> raw;
  const auto zero = zero_with_raw_peer(raw, comm_test::free_addresses(2));
  const std::vector<unsigned char> noise(24, 0xAB), more(1 << 20, 0x5A);
  raw->write(noise);
  raw->write(more);  // still coming when rank 0 has refused the noise
  std::this_thread::sleep_for(300ms);
  std::string farewell;
  for (tcp::HeaderBytes header{}; farewell.empty() && raw->read(header.data(), header.size());) {
    const tcp::FrameHeader frame = tcp::decode(header);
    REQUIRE(frame.length <= tcp::kMaxRefusalBytes);
    std::string payload(static_cast<std::size_t>(frame.length), '\0');
    REQUIRE(raw->read(payload.data(), payload.size()));
    if (frame.type == tcp::FrameType::Failed) farewell = payload;
  }
  CHECK_THAT(farewell, Catch::Contains("what arrived from worker 1") && Catch::Contains("broke the protocol"));
}

namespace {

// This process's resident memory, in bytes.
std::int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

}  // namespace

TEST_CASE("tcp: a frame header announcing gigabytes allocates only what arrives", "[comm][tcp][security]") {
  std::unique_ptr<RawClient> raw;
  const auto zero = zero_with_raw_peer(raw, comm_test::free_addresses(2));
  RawClient& peer = *raw;
  const std::int64_t before = resident_bytes();
  // A member announces 3 GiB on a tag nobody receives, sends 1 MiB of it, then falls silent.
  peer.write(tcp::encode({.type = tcp::FrameType::Announce, .tag = std::uint64_t{3} << 30}));
  peer.write(tcp::encode({.type = tcp::FrameType::Data, .tag = 9, .length = std::uint64_t{3} << 30}));
  peer.write(std::vector<unsigned char>(1 << 20, 0x5A));
  std::vector<int> out(4);
  auto pending = zero->recv(1, 1, conformance::bytes(out));
  CHECK_THROWS_WITH(pending->wait(10s), Catch::Contains("lost worker 1") && Catch::Contains("silent"));
  CHECK(resident_bytes() - before < (std::int64_t{256} << 20));  // sanitizers' shadow memory included; 3 GiB before
}

namespace {

// This process's peak resident memory since the last reset_peak_resident(), in bytes.
std::int64_t peak_resident_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}

void reset_peak_resident() {
  std::ofstream clear_refs("/proc/self/clear_refs");
  clear_refs << "5" << std::flush;
  REQUIRE(clear_refs.good());
}

}  // namespace

TEST_CASE("tcp: a receive posted while its message arrives takes the rest straight into its buffer", "[comm][tcp]") {
  // The buffers first: filling them takes long under sanitizers, and a connected peer that long silent is lost.
  constexpr std::size_t kBytes = 96 << 20;
  std::vector<unsigned char> sent(kBytes);
  for (std::size_t i = 0; i < kBytes; ++i) sent[i] = static_cast<unsigned char>(i * 131 % 251);
  std::vector<unsigned char> out(kBytes, 0);  // touched: resident before the peak is measured
  std::unique_ptr<RawClient> raw;
  const auto zero = zero_with_raw_peer(raw, comm_test::free_addresses(2));
  RawClient& peer = *raw;
  reset_peak_resident();
  const std::int64_t before = peak_resident_bytes();
  REQUIRE(before - resident_bytes() < (std::int64_t{16} << 20));  // the reset took: the peak is where we are
  peer.write(tcp::encode({.type = tcp::FrameType::Announce, .tag = kBytes}));
  peer.write(tcp::encode({.type = tcp::FrameType::Data, .tag = 9, .length = kBytes}));
  constexpr std::size_t kEarly = 3 << 20;
  peer.write(sent.data(), kEarly);
  std::this_thread::sleep_for(200ms);  // rank 0 is reading it with no receive posted
  auto received = zero->recv(1, 9, std::as_writable_bytes(std::span(out)));
  std::thread rest([&] { peer.write(sent.data() + kEarly, kBytes - kEarly); });
  const auto arrived = [&] {
    try {
      received->wait(10s);
      return true;
    } catch (...) {
      return false;
    }
  }();
  rest.join();
  REQUIRE(arrived);
  CHECK(out == sent);
  // Buffered whole and then copied, the message would have doubled the peak.
  CHECK(peak_resident_bytes() - before < static_cast<std::int64_t>(kBytes / 4));
}

TEST_CASE("tcp: messages that come before their receives, whole or in part, arrive intact through reused buffers", "[comm][tcp]") {
  std::unique_ptr<RawClient> raw;
  const auto zero = zero_with_raw_peer(raw, comm_test::free_addresses(2));
  RawClient& peer = *raw;
  const auto message = [](std::size_t bytes, int seed) {
    std::vector<unsigned char> m(bytes);
    for (std::size_t i = 0; i < bytes; ++i) m[i] = static_cast<unsigned char>((i * 7 + static_cast<std::size_t>(seed) * 13) % 251);
    return m;
  };
  const auto receive = [&](Tag tag, std::size_t bytes) {
    std::vector<unsigned char> out(bytes, 0xEE);
    zero->recv(1, tag, std::as_writable_bytes(std::span(out)))->wait(5s);
    return out;
  };
  peer.write(tcp::encode({.type = tcp::FrameType::Announce, .tag = 300 << 10}));
  // Larger, smaller, empty and larger again, so that each reuses a buffer another one left.
  const std::vector<std::size_t> sizes{300 << 10, 1, 0, 200 << 10, 299 << 10, 100 << 10};
  for (std::size_t m = 0; m < sizes.size(); ++m) {
    const auto bytes = message(sizes[m], static_cast<int>(m));
    peer.write(tcp::encode({.type = tcp::FrameType::Data, .tag = 3, .length = bytes.size()}));
    peer.write(bytes.data(), bytes.size());
  }
  std::this_thread::sleep_for(200ms);  // all of them buffered before any receive
  for (std::size_t m = 0; m < sizes.size(); ++m) CHECK(receive(3, sizes[m]) == message(sizes[m], static_cast<int>(m)));
  // One whose receive comes while it arrives takes over the bytes already read into a reused buffer.
  const auto arriving = message(280 << 10, 40);
  peer.write(tcp::encode({.type = tcp::FrameType::Data, .tag = 4, .length = arriving.size()}));
  peer.write(arriving.data(), 100 << 10);
  std::this_thread::sleep_for(200ms);
  std::vector<unsigned char> out(arriving.size(), 0xEE);
  auto received = zero->recv(1, 4, std::as_writable_bytes(std::span(out)));
  peer.write(arriving.data() + (100 << 10), arriving.size() - (100 << 10));
  received->wait(5s);
  CHECK(out == arriving);
  const auto after = message(50 << 10, 41);
  peer.write(tcp::encode({.type = tcp::FrameType::Data, .tag = 4, .length = after.size()}));
  peer.write(after.data(), after.size());
  std::this_thread::sleep_for(100ms);
  CHECK(receive(4, after.size()) == after);
}

TEST_CASE("tcp: a receive that took over an arriving message fails naming the sender when it is lost mid-message",
          "[comm][tcp]") {
  std::unique_ptr<RawClient> raw;
  const auto zero = zero_with_raw_peer(raw, comm_test::free_addresses(2));
  constexpr std::size_t kBytes = 8 << 20;
  raw->write(tcp::encode({.type = tcp::FrameType::Announce, .tag = kBytes}));
  raw->write(tcp::encode({.type = tcp::FrameType::Data, .tag = 9, .length = kBytes}));
  raw->write(std::vector<unsigned char>(1 << 20, 0x5A));
  std::this_thread::sleep_for(200ms);
  std::vector<unsigned char> out(kBytes);
  auto received = zero->recv(1, 9, std::as_writable_bytes(std::span(out)));
  std::this_thread::sleep_for(100ms);
  raw.reset();  // the sender dies with 7 MiB of its message unsent
  CHECK_THROWS_WITH(received->wait(10s), Catch::Contains("lost worker 1"));
}

TEST_CASE("tcp: a data header above what its sender announced is refused at once, before any sizes are declared",
          "[comm][tcp][security]") {
  // announced: what the raw peer announces first (0: nothing, so the 256 KiB always expected).
  for (const std::uint64_t announced : {std::uint64_t{0}, std::uint64_t{1} << 20}) {
    INFO("announced " << announced);
    std::unique_ptr<RawClient> raw;
    const auto zero = zero_with_raw_peer(raw, comm_test::free_addresses(2));
    RawClient& peer = *raw;
    if (announced > 0) peer.write(tcp::encode({.type = tcp::FrameType::Announce, .tag = announced}));
    const auto started = std::chrono::steady_clock::now();
    peer.write(tcp::encode({.type = tcp::FrameType::Data, .tag = 3, .length = std::max(announced, kAlwaysExpectedBytes) + 1}));
    std::vector<int> out(4);
    auto pending = zero->recv(1, 1, conformance::bytes(out));
    CHECK_THROWS_AS(pending->wait(10s), ProtocolError);
    CHECK_THROWS_WITH(zero->send(1, 1, conformance::bytes(out))->wait(1s),
                      Catch::Contains("lost worker 1") && Catch::Contains("above the") && Catch::Contains("its sender announced"));
    CHECK(std::chrono::steady_clock::now() - started < 3s);
  }
}

TEST_CASE("tcp: a message above 256 KiB to a peer that declared no sizes arrives, announced first", "[comm][tcp]") {
  const auto addresses = comm_test::free_addresses(2);
  std::unique_ptr<Transport> zero, one;
  std::thread listener([&] { zero = connect_tcp(options_for(0, addresses)); });
  one = connect_tcp(options_for(1, addresses));
  listener.join();
  std::vector<int> big(std::size_t{1} << 20, 7), small(8, 2);
  one->send(0, 5, conformance::bytes(small))->wait(5s);
  one->send(0, 6, conformance::bytes(big))->wait(10s);  // buffered by rank 0: no receive awaits it yet
  std::this_thread::sleep_for(100ms);
  std::vector<int> got_big(big.size()), got_small(small.size());
  zero->recv(1, 6, conformance::bytes(got_big))->wait(10s);
  zero->recv(1, 5, conformance::bytes(got_small))->wait(5s);
  CHECK(got_big == big);
  CHECK(got_small == small);
}

TEST_CASE("tcp: a peer that vanishes or falls silent fails every rank's operations, naming it", "[comm][tcp]") {
  SECTION("connection closed without goodbye") {
    const auto addresses = comm_test::free_addresses(3);
    std::unique_ptr<Transport> zero, one;
    std::optional<RawClient> two;
    std::thread a([&] { zero = connect_tcp(options_for(0, addresses)); });
    std::thread b([&] { one = connect_tcp(options_for(1, addresses)); });
    // rank 2 is hand-made: it authenticates with ranks 0 and 1, then its link to rank 0 breaks. Rank 1,
    // whose own link to rank 2 stays open, learns of the loss from rank 0's abort message.
    two.emplace(addresses[0]);
    REQUIRE(handshake(*two, 2, kSecret, tcp::random_nonce(), addresses));
    RawClient to_one(addresses[1]);
    REQUIRE(handshake(to_one, 2, kSecret, tcp::random_nonce(), addresses, 1));
    a.join();
    b.join();
    std::vector<int> out(1);
    auto waiting_on_one = zero->recv(1, 9, conformance::bytes(out));  // not on the lost rank
    auto one_waiting = one->recv(0, 9, conformance::bytes(out));
    two.reset();  // rank 2's link to rank 0 closes abruptly
    CHECK_THROWS_WITH(waiting_on_one->wait(5s), Catch::Contains("lost worker 2"));
    CHECK_THROWS_WITH(one_waiting->wait(5s), Catch::Contains("lost worker 2"));
  }
  SECTION("silent peer") {
    const auto addresses = comm_test::free_addresses(2);
    std::unique_ptr<Transport> zero;
    std::thread a([&] {
      auto options = options_for(0, addresses);
      options.peer_timeout = 500ms;
      zero = connect_tcp(options);
    });
    RawClient hung(addresses[0]);
    REQUIRE(handshake(hung, 1, kSecret, tcp::random_nonce(), addresses, 0, 500ms));
    a.join();
    std::vector<int> out(1);
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH(zero->recv(1, 1, conformance::bytes(out))->wait(5s), Catch::Contains("silent"));
    CHECK(std::chrono::steady_clock::now() - start < 3s);
  }
}

TEST_CASE("tcp: a dialer with the wrong rank or addresses is told why and fails at once", "[comm][tcp]") {
  const auto addresses = comm_test::free_addresses(2);
  std::unique_ptr<Transport> zero;
  std::thread listener([&] { zero = connect_tcp(options_for(0, addresses)); });
  // Rank 2 of a group of 3 dials rank 0, whose group has 2 ranks.
  auto stray = options_for(2, {addresses[0], comm_test::free_addresses(1)[0], comm_test::free_addresses(1)[0]});
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(connect_tcp(stray), ProtocolError);
  CHECK_THROWS_WITH(connect_tcp(stray), Catch::Contains("refused it: it claims rank 2, which is no rank that may dial this one"));
  // Rank 2 of 3 whose list puts its rank 1 where rank 0 of the other group listens.
  auto swapped = options_for(2, {comm_test::free_addresses(1)[0], addresses[0], comm_test::free_addresses(1)[0]});
  CHECK_THROWS_WITH(connect_tcp(swapped), Catch::Contains("dialed rank 1, which does not listen at this address"));
  // Rank 1 of a group whose address list, or whose deadlines, differ from rank 0's.
  // A member (it knows the secret) is told how its settings differ, once it has proven the secret.
  auto other_list = options_for(1, {addresses[0], comm_test::free_addresses(1)[0]});
  CHECK_THROWS_WITH(connect_tcp(other_list), Catch::Contains("list of the group's addresses is not this rank's"));
  auto other_deadlines = options_for(1, addresses);
  other_deadlines.peer_timeout = 5s;
  CHECK_THROWS_WITH(connect_tcp(other_deadlines),
                    Catch::Contains("loses a silent peer after 5000 ms, this rank every 100 ms and after 3000 ms"));
  auto other_timeout = options_for(1, addresses);
  other_timeout.timeout = 20s;
  CHECK_THROWS_WITH(connect_tcp(other_timeout),
                    Catch::Contains("it waits 20000 ms for a peer's progress, this rank 10000 ms: set COHORT_TIMEOUT alike "
                                    "everywhere"));
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  legitimate_peer_still_works(listener, zero, addresses);
}

TEST_CASE("tcp: a stranger whose hello carries another layout or deadlines learns nothing of the group", "[comm][tcp][security]") {
  const auto addresses = comm_test::free_addresses(2);
  std::unique_ptr<Transport> zero;
  std::thread listener([&] { zero = connect_tcp(options_for(0, addresses)); });
  for (const bool other_layout : {true, false}) {
    INFO((other_layout ? "another cluster list" : "other deadlines"));
    const auto listed = other_layout ? std::vector<Address>{addresses[0], comm_test::free_addresses(1)[0]} : addresses;
    RawClient stranger(addresses[0]);
    stranger.write(hello_frame(1, tcp::random_nonce(), 0, listed, other_layout ? 3s : 7s));
    // The listener answers a possible rank with its challenge, as to anybody: a bare nonce, nothing
    // computed from the secret that could test a guess offline.
    tcp::HeaderBytes header{};
    REQUIRE(stranger.read(header.data(), header.size()));
    const tcp::FrameHeader challenge = tcp::decode(header);
    CHECK(challenge.type == tcp::FrameType::Challenge);
    CHECK(challenge.length == tcp::kNonceBytes);
    tcp::Nonce nonce{};
    REQUIRE(stranger.read(nonce.data(), nonce.size()));
    // Without the secret its response is wrong: it is told that much, and nothing of the layout or deadlines.
    stranger.write(response_frame(tcp::Mac{}));
    const std::string reason = refusal_of(stranger);
    CHECK_THAT(reason, Catch::Contains("proof of the shared secret is wrong"));
    CHECK_THAT(reason, !Catch::Contains("address") && !Catch::Contains(" ms"));
    CHECK(stranger.closed_by_peer());
  }
  legitimate_peer_still_works(listener, zero, addresses);
}

TEST_CASE("tcp: a listener's challenge does not say which rank it is", "[comm][tcp][security]") {
  const auto addresses = comm_test::free_addresses(3);
  std::unique_ptr<Transport> zero, one;
  std::thread first([&] { zero = connect_tcp(options_for(0, addresses)); });
  std::thread second([&] { one = connect_tcp(options_for(1, addresses)); });
  {
    RawClient stranger(addresses[1]);
    stranger.write(hello_frame(2, tcp::random_nonce(), 1, addresses));
    tcp::HeaderBytes header{};
    REQUIRE(stranger.read(header.data(), header.size()));
    const tcp::FrameHeader challenge = tcp::decode(header);
    CHECK(challenge.type == tcp::FrameType::Challenge);
    CHECK(challenge.tag == 0);  // not 1
  }
  auto two = connect_tcp(options_for(2, addresses));  // the legitimate rank 2 still gets in
  first.join();
  second.join();
  CHECK(two->size() == 3);
}

TEST_CASE("tcp: a peer lost during set-up fails set-up at once, naming it", "[comm][tcp]") {
  // Two ranks of 4 wait for another; hand-made rank 2, which both wait for too, authenticates with both,
  // then its process ends. Every pair connects at set-up, or (on demand) ring neighbours only: then ranks 1
  // and 3 wait for rank 0 and for rank 2, their neighbours.
  for (const bool on_demand : {false, true}) {
    INFO((on_demand ? "connections on demand" : "every pair at set-up"));
    const auto addresses = comm_test::free_addresses(4);
    const std::array<int, 2> waiting = on_demand ? std::array{1, 3} : std::array{0, 1};
    std::array<std::exception_ptr, 2> errors;
    std::vector<std::thread> ranks;
    for (std::size_t i = 0; i < waiting.size(); ++i) {
      GroupOptions options = options_for(waiting[i], addresses);
      options.connect_on_demand = on_demand;
      ranks.push_back(failing_set_up(options, errors[i]));
    }
    {
      RawClient to_first(addresses[static_cast<std::size_t>(waiting[0])]);
      REQUIRE(handshake(to_first, 2, kSecret, tcp::random_nonce(), addresses, waiting[0]));
      RawClient to_second(addresses[static_cast<std::size_t>(waiting[1])]);
      REQUIRE(handshake(to_second, 2, kSecret, tcp::random_nonce(), addresses, waiting[1]));
      std::this_thread::sleep_for(200ms);  // both listeners have counted rank 2 in
    }
    const auto closed = std::chrono::steady_clock::now();
    for (auto& rank : ranks) rank.join();
    CHECK(std::chrono::steady_clock::now() - closed < 3s);  // not the 10 s connect deadline
    for (const auto& error : errors) {
      REQUIRE(error != nullptr);
      CHECK_THROWS_AS(std::rethrow_exception(error), IoError);
      CHECK_THROWS_WITH(std::rethrow_exception(error), Catch::Contains("could not finish set-up") && Catch::Contains("lost worker 2"));
    }
  }
}

TEST_CASE("tcp: a rank that never comes is named by every rank, not only by the first to give up", "[comm][tcp]") {
  // Rank 2 never starts. Rank 0 gives up first (its connect deadline is shorter); rank 1, connected to rank
  // 0, learns whom the group lacks instead of seeing rank 0 leave.
  const auto addresses = comm_test::free_addresses(3);
  std::exception_ptr zero_error, one_error;
  const auto started = std::chrono::steady_clock::now();
  auto impatient = options_for(0, addresses);
  impatient.connect_timeout = 1500ms;
  std::thread zero = failing_set_up(impatient, zero_error);
  std::thread one = failing_set_up(options_for(1, addresses), one_error);
  zero.join();
  one.join();
  CHECK(std::chrono::steady_clock::now() - started < 5s);  // not rank 1's 10 s connect deadline
  REQUIRE(zero_error != nullptr);
  CHECK_THROWS_WITH(std::rethrow_exception(zero_error), Catch::Contains("could not connect within 1500 ms to worker 2"));
  REQUIRE(one_error != nullptr);
  CHECK_THROWS_WITH(std::rethrow_exception(one_error), Catch::Contains("could not finish set-up: lost worker 2") &&
                                                           Catch::Contains("reported by chief 0"));
}

namespace {

// Ranks 0 and 1 of 4 set up while rank 3 never starts; rank 2 (raw) reaches rank 0 alone and reports
// `lost` lost. Returns how set-up failed on ranks 0 and 1, and how long after the report.
struct ReportedLoss {
  std::exception_ptr zero_error, one_error;
  std::chrono::steady_clock::duration after_report;
};
ReportedLoss report_loss_to_rank_zero(std::uint64_t lost) {
  const auto addresses = comm_test::free_addresses(4);
  ReportedLoss outcome;
  std::thread zero = failing_set_up(options_for(0, addresses), outcome.zero_error);
  std::thread one = failing_set_up(options_for(1, addresses), outcome.one_error);
  std::this_thread::sleep_for(300ms);  // ranks 0 and 1 have connected
  RawClient to_zero(addresses[0]);
  const bool accepted = handshake(to_zero, 2, kSecret, tcp::random_nonce(), addresses).has_value();
  std::this_thread::sleep_for(200ms);
  const auto abort = tcp::encode({.type = tcp::FrameType::Abort, .tag = lost});
  to_zero.write(abort.data(), abort.size());
  const auto reported = std::chrono::steady_clock::now();
  zero.join();
  one.join();
  outcome.after_report = std::chrono::steady_clock::now() - reported;
  REQUIRE(accepted);
  return outcome;
}

}  // namespace

TEST_CASE("tcp: a rank told whom the group lost passes it on to the ranks its reporter has not reached", "[comm][tcp]") {
  // Rank 2 reports rank 3 lost; rank 1, connected to rank 0 but not to rank 2, learns the cause from
  // rank 0 instead of seeing rank 0 leave.
  const auto [zero_error, one_error, after_report] = report_loss_to_rank_zero(3);
  CHECK(after_report < 3s);  // not the 10 s connect deadline
  REQUIRE(zero_error != nullptr);
  CHECK_THROWS_WITH(std::rethrow_exception(zero_error), Catch::Contains("lost worker 3") && Catch::Contains("reported by worker 2"));
  REQUIRE(one_error != nullptr);
  CHECK_THROWS_WITH(std::rethrow_exception(one_error), Catch::Contains("could not finish set-up: lost worker 3") &&
                                                           Catch::Contains("reported by chief 0"));
}

TEST_CASE("tcp: a rank told that the group lost it says so, instead of naming itself lost", "[comm][tcp]") {
  // Rank 2 reports rank 1 lost: rank 0 passes that on to rank 1 itself.
  const auto [zero_error, one_error, after_report] = report_loss_to_rank_zero(1);
  REQUIRE(zero_error != nullptr);
  CHECK_THROWS_WITH(std::rethrow_exception(zero_error), Catch::Contains("lost worker 1") && Catch::Contains("reported by worker 2"));
  REQUIRE(one_error != nullptr);
  CHECK_THROWS_WITH(std::rethrow_exception(one_error),
                    Catch::Contains("chief 0") && Catch::Contains("reports that the group lost this rank, worker 1"));
}

namespace {

// The listener's side of a handshake on an accepted socket, up to the dialer's proof: what the acceptance
// of `client_rank` by `server_rank` must then prove (tcp::server_proof). Nullopt when the dialer stops
// short. It asserts nothing: it runs on threads of its own, and Catch's assertions are for the test's.
struct AwaitedAcceptance {
  tcp::Nonce client{}, server{};
};
std::optional<AwaitedAcceptance> challenge_and_take_proof(int fd) {
  const auto received = [fd](void* into, std::size_t size) {
    return ::recv(fd, into, size, MSG_WAITALL) == static_cast<ssize_t>(size);
  };
  AwaitedAcceptance awaited;
  tcp::HeaderBytes header{};
  tcp::HelloBytes hello{};
  if (!received(header.data(), header.size()) || !received(hello.data(), hello.size())) return std::nullopt;
  awaited.client = tcp::decode_hello(hello).nonce;
  awaited.server = tcp::random_nonce();
  const auto challenge = tcp::encode({.type = tcp::FrameType::Challenge, .length = tcp::kNonceBytes});
  ::send(fd, challenge.data(), challenge.size(), MSG_NOSIGNAL);
  ::send(fd, awaited.server.data(), awaited.server.size(), MSG_NOSIGNAL);
  std::array<std::byte, tcp::kHeaderBytes + tcp::kMacBytes> response{};
  if (!received(response.data(), response.size())) return std::nullopt;
  return awaited;
}

void accept_with_proof(int fd, const AwaitedAcceptance& awaited, int client_rank, int server_rank) {
  const auto accepted = tcp::encode({.type = tcp::FrameType::Accepted, .tag = static_cast<std::uint64_t>(server_rank),
                                     .length = tcp::kMacBytes});
  const tcp::Mac proof = tcp::server_proof(kSecret, awaited.client, awaited.server, client_rank, server_rank);
  ::send(fd, accepted.data(), accepted.size(), MSG_NOSIGNAL);
  ::send(fd, proof.data(), proof.size(), MSG_NOSIGNAL);
}

}  // namespace

TEST_CASE("tcp: a rank whose set-up fails tells a peer whose handshake completes meanwhile why, not only closing",
          "[comm][tcp]") {
  // Rank 2 dials raw ranks 0 and 1. Rank 1 accepts it and then sends garbage, which ends rank 2's set-up;
  // rank 0 accepts it only after that. Rank 0 must hear that the group lost rank 1.
  const auto addresses = comm_test::free_addresses(3);
  const int zero_listening = raw_listener(addresses[0]), one_listening = raw_listener(addresses[1]);
  std::atomic<bool> zero_holds_proof{false}, garbage_sent{false};
  std::optional<AwaitedAcceptance> one_awaited, zero_awaited;
  std::thread one([&] {
    const int fd = ::accept(one_listening, nullptr, nullptr);
    one_awaited = challenge_and_take_proof(fd);
    if (one_awaited) accept_with_proof(fd, *one_awaited, 2, 1);
    // Only once rank 2 awaits rank 0's acceptance: its handshake with rank 0 is then the one finishing.
    for (int i = 0; i < 5000 && !zero_holds_proof; ++i) std::this_thread::sleep_for(1ms);
    const std::vector<unsigned char> noise(24, 0xAB);
    ::send(fd, noise.data(), noise.size(), MSG_NOSIGNAL);
    garbage_sent = true;
    std::this_thread::sleep_for(2s);
    ::close(fd);
  });
  std::vector<tcp::FrameHeader> heard;
  std::thread zero([&] {
    const int fd = ::accept(zero_listening, nullptr, nullptr);
    zero_awaited = challenge_and_take_proof(fd);
    zero_holds_proof = true;
    while (!garbage_sent) std::this_thread::sleep_for(1ms);
    std::this_thread::sleep_for(50ms);  // rank 2's set-up has failed by now
    if (zero_awaited) accept_with_proof(fd, *zero_awaited, 2, 0);
    timeval limit{.tv_sec = 5, .tv_usec = 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    for (tcp::HeaderBytes header{}; ::recv(fd, header.data(), header.size(), MSG_WAITALL) == static_cast<ssize_t>(header.size());) {
      const tcp::FrameHeader frame = tcp::decode(header);
      heard.push_back(frame);
      std::vector<std::byte> payload(static_cast<std::size_t>(std::min<std::uint64_t>(frame.length, 1 << 16)));
      if (!payload.empty()) ::recv(fd, payload.data(), payload.size(), MSG_WAITALL);
    }
    ::close(fd);
  });
  CHECK_THROWS_AS(connect_tcp(options_for(2, addresses)), ProtocolError);
  one.join();
  zero.join();
  ::close(zero_listening);
  ::close(one_listening);
  REQUIRE(one_awaited);
  REQUIRE(zero_awaited);
  // An abort naming rank 1, the rank that broke the protocol.
  CHECK(std::any_of(heard.begin(), heard.end(),
                    [](const tcp::FrameHeader& frame) { return frame.type == tcp::FrameType::Abort && frame.tag == 1; }));
}

TEST_CASE("tcp: a frame that takes longer than the peer timeout to arrive is not silence", "[comm][tcp]") {
  const auto addresses = comm_test::free_addresses(2);
  std::unique_ptr<Transport> zero;
  std::thread a([&] {
    auto options = options_for(0, addresses);
    options.peer_timeout = 400ms;
    zero = connect_tcp(options);
  });
  RawClient slow(addresses[0]);
  REQUIRE(handshake(slow, 1, kSecret, tcp::random_nonce(), addresses, 0, 400ms));
  a.join();
  std::vector<std::uint8_t> message(16 * 1024), out(message.size());
  for (std::size_t i = 0; i < message.size(); ++i) message[i] = static_cast<std::uint8_t>(i * 7);
  auto received = zero->recv(1, 4, std::as_writable_bytes(std::span(out)));
  // About 2.5 s for one frame, at most 100 ms between arrivals: a link of some 8 KB/s.
  const auto header = tcp::encode({.type = tcp::FrameType::Data, .tag = 4, .length = message.size()});
  for (const std::byte& b : header) {
    slow.write(&b, 1);
    std::this_thread::sleep_for(40ms);
  }
  for (std::size_t at = 0; at < message.size(); at += 1024) {
    slow.write(message.data() + at, 1024);
    std::this_thread::sleep_for(90ms);
  }
  received->wait(5s);
  CHECK(out == message);
}

TEST_CASE("tcp: after callers drove the links, the transport's own thread reads, heartbeats and serves several waiters",
          "[comm][tcp]") {
  const auto addresses = comm_test::free_addresses(2);
  auto group = connect_group(2, addresses, [](GroupOptions& options) { options.peer_timeout = 300ms; });
  // Round trips whose waiting callers drive both sides' sockets.
  std::vector<int> ping{0}, pong{0};
  comm_test::run_ranks(2, [&](int r) {
    for (int i = 0; i < 200; ++i) {
      if (r == 0) {
        ping[0] = i;
        auto sent = group[0]->send(1, 1, conformance::bytes(ping));
        group[0]->recv(1, 2, conformance::bytes(pong))->wait(5s);
        sent->wait(5s);
      } else {
        std::vector<int> in{0};
        group[1]->recv(0, 1, conformance::bytes(in))->wait(5s);
        group[1]->send(0, 2, conformance::bytes(in))->wait(5s);
      }
    }
  });
  CHECK(pong[0] == 199);
  // Nobody waits for three peer timeouts: only heartbeats sent meanwhile keep the peers from being lost.
  std::this_thread::sleep_for(900ms);
  // A message that arrives while nobody waits is read: its receive completes without a wait driving it.
  std::vector<int> value{42}, out{0};
  auto unwaited = group[0]->recv(1, 3, conformance::bytes(out));
  auto sent = group[1]->send(0, 3, conformance::bytes(value));
  const auto give_up = std::chrono::steady_clock::now() + 5s;
  while (!unwaited->done() && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(1ms);
  REQUIRE(unwaited->done());
  unwaited->wait(0ms);
  sent->wait(5s);
  CHECK(out[0] == 42);
  // Four threads wait at once on one transport (one drives, the others sleep); the messages come last first.
  constexpr int kWaiters = 4;
  std::vector<std::vector<int>> received(kWaiters, std::vector<int>(1024, 0));
  std::vector<std::vector<int>> messages(kWaiters);
  for (int w = 0; w < kWaiters; ++w) messages[static_cast<std::size_t>(w)].assign(1024, w + 100);
  comm_test::run_ranks(kWaiters + 1, [&](int w) {
    if (w < kWaiters) return group[0]->recv(1, 10 + w, conformance::bytes(received[static_cast<std::size_t>(w)]))->wait(5s);
    for (int m = kWaiters - 1; m >= 0; --m) {
      std::this_thread::sleep_for(20ms);
      group[1]->send(0, 10 + m, conformance::bytes(messages[static_cast<std::size_t>(m)]))->wait(5s);
    }
  });
  CHECK(received == messages);
}

TEST_CASE("tcp: a wait for a large message polls while every rank on the host has a core, and blocks where they share cores",
          "[comm][tcp]") {
  GroupOptions options;
  options.addresses = {{"10.0.0.1", 7000}, {"10.0.0.2", 7000}, {"10.0.0.1", 7001}, {"10.0.0.1", 7002}};
  CHECK(tcp::ranks_on_own_host(options) == 3);
  options.rank = 1;
  CHECK(tcp::ranks_on_own_host(options) == 1);
  asio::io_context io;
  {
    tcp::IoDriver sharing(io, /*own_core=*/false);
    CHECK(&sharing.poller_for(4 << 10) != &sharing.poller_for(4 << 20));
  }
  io.restart();
  tcp::IoDriver owning(io, /*own_core=*/true);
  CHECK(&owning.poller_for(4 << 10) == &owning.poller_for(4 << 20));
}

TEST_CASE("tcp: a link within the host sends through a small buffer and leaves the receive buffer to the kernel",
          "[comm][tcp]") {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io, {asio::ip::make_address("127.0.0.1"), 0});
  asio::ip::tcp::socket tuned(io), untuned(io);
  tuned.connect(acceptor.local_endpoint());
  acceptor.accept(untuned);
  tcp::tune_connected(tuned);
  asio::ip::tcp::no_delay no_delay;
  tuned.get_option(no_delay);
  CHECK(no_delay.value());
  asio::socket_base::send_buffer_size sending;
  tuned.get_option(sending);
  CHECK(sending.value() == tcp::kSameHostSendBuffer);  // Linux doubles it, Asio halves what Linux reports
  asio::socket_base::receive_buffer_size receiving, kernels;
  tuned.get_option(receiving);
  untuned.get_option(kernels);
  CHECK(receiving.value() == kernels.value());

  // Autotuning grows a receive buffer that nobody fixed, as a stream of bytes goes through it.
  std::ifstream moderate("/proc/sys/net/ipv4/tcp_moderate_rcvbuf");
  int autotunes = 1;
  moderate >> autotunes;
  if (autotunes == 0) return;
  const std::size_t total = std::size_t{64} << 20;
  std::thread writer([&] {
    std::vector<char> block(std::size_t{1} << 20, 'x');
    for (std::size_t sent = 0; sent < total; sent += block.size()) asio::write(untuned, asio::buffer(block));
  });
  std::vector<char> into(std::size_t{1} << 20);
  for (std::size_t read = 0; read < total;) read += tuned.read_some(asio::buffer(into));
  writer.join();
  tuned.get_option(receiving);
  CHECK(receiving.value() > kernels.value());
}

TEST_CASE("tcp: a send still being written when its transport is destroyed has failed, and waiting on it says so",
          "[comm][tcp]") {
  const auto addresses = comm_test::free_addresses(2);
  std::unique_ptr<Transport> zero;
  std::thread a([&] { zero = connect_tcp(options_for(0, addresses)); });
  RawClient never_reads(addresses[0]);
  REQUIRE(handshake(never_reads, 1, kSecret, tcp::random_nonce(), addresses, 0, 3s));
  a.join();
  // Far more than the socket buffers hold: the write is in flight when the transport goes.
  std::vector<std::byte> large(std::size_t{64} << 20, std::byte{1});
  auto sent = zero->send(1, 2, large);
  std::this_thread::sleep_for(100ms);
  zero.reset();
  REQUIRE(sent->done());
  CHECK_THROWS_AS(sent->wait(100ms), IoError);
}

TEST_CASE("tcp: a clean shutdown fails only what needed the departed peer", "[comm][tcp]") {
  const auto addresses = comm_test::free_addresses(3);
  auto group = connect_group(3, addresses);
  std::vector<int> out(1), value{3};
  auto waiting_on_two = group[0]->recv(2, 1, conformance::bytes(out));
  group[2].reset();
  CHECK_THROWS_WITH(waiting_on_two->wait(5s), Catch::Contains("worker 2") && Catch::Contains("left"));
  auto sent = group[0]->send(1, 1, conformance::bytes(value));
  group[1]->recv(0, 1, conformance::bytes(out))->wait(5s);
  sent->wait(5s);
  CHECK(out[0] == 3);
}

int connections_of(const std::unique_ptr<Transport>& transport) { return comm::connections_of(*transport).value_or(-1); }

// A hand-made rank's part in set-up's token round (connections on demand): it reads frames from the rank
// before it until a token comes (heartbeats skipped), and passes the token to the rank after it, twice.
void pass_set_up_tokens(RawClient& from_previous, RawClient& to_next) {
  for (int lap = 0; lap < 2; ++lap) {
    for (;;) {
      tcp::HeaderBytes header{};
      REQUIRE(from_previous.read(header.data(), header.size()));
      const tcp::FrameHeader frame = tcp::decode(header);
      std::vector<std::byte> payload(static_cast<std::size_t>(frame.length));
      if (!payload.empty()) REQUIRE(from_previous.read(payload.data(), payload.size()));
      if (frame.type == tcp::FrameType::Data && frame.tag == tcp::kSetUpTag) break;
    }
    const auto header = tcp::encode({.type = tcp::FrameType::Data, .tag = tcp::kSetUpTag, .length = 1});
    std::vector<std::byte> token(header.begin(), header.end());
    token.push_back(std::byte{0});
    to_next.write(token);
  }
}

TEST_CASE("tcp: on demand, set-up waits for every rank, a late one included, and all name one that never comes", "[comm][tcp]") {
  constexpr int n = 6;
  {
    // Rank 3 starts 1.5 s after the others, whose collectives give up after 1 s: their set-up waits for it.
    const auto addresses = comm_test::free_addresses(n);
    std::vector<std::unique_ptr<Transport>> group(n);
    comm_test::run_ranks(n, [&](int r) {
      if (r == 3) std::this_thread::sleep_for(1500ms);
      GroupOptions options = options_for(r, addresses);
      options.timeout = 1s;
      group[static_cast<std::size_t>(r)] = connect_tcp(options);
    });
    conformance::broadcast_allgather_barrier(conformance::members_of(group));
  }
  // Rank 3 never comes: every rank's set-up fails naming it, not a neighbour that gave up before it.
  const auto addresses = comm_test::free_addresses(n);
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r) {
    if (r == 3) continue;
    GroupOptions options = options_for(r, addresses);
    options.connect_timeout = 1s;
    ranks.push_back(failing_set_up(options, errors[static_cast<std::size_t>(r)]));
  }
  for (auto& rank : ranks) rank.join();
  for (int r = 0; r < n; ++r) {
    if (r == 3) continue;
    INFO("rank " << r);
    REQUIRE(errors[static_cast<std::size_t>(r)] != nullptr);
    CHECK_THROWS_WITH(std::rethrow_exception(errors[static_cast<std::size_t>(r)]), Catch::Contains("worker 3"));
  }
}

TEST_CASE("tcp: on demand, set-up links ring neighbours, and any other pair connects at its first message, both dialing at once included",
          "[comm][tcp]") {
  constexpr int n = 7;
  for (int round = 0; round < 3; ++round) {
    INFO("round " << round);
    const auto addresses = comm_test::free_addresses(n);
    auto group = connect_group(n, addresses);
    for (const auto& t : group) CHECK(connections_of(t) == 2);
    // Every rank sends to every other at once, so that most pairs dial each other at the same moment.
    comm_test::run_ranks(n, [&](int r) {
      Transport& t = *group[static_cast<std::size_t>(r)];
      std::vector<int> mine(1000, r);
      std::vector<std::vector<int>> theirs(n, std::vector<int>(1000, -1));
      std::vector<WorkPtr> works;
      for (int peer = 0; peer < n; ++peer) {
        if (peer == r) continue;
        works.push_back(t.send(peer, 5, conformance::bytes(mine)));
        works.push_back(t.recv(peer, 5, conformance::bytes(theirs[static_cast<std::size_t>(peer)])));
      }
      wait_all(works, t.timeout());
      for (int peer = 0; peer < n; ++peer)
        if (peer != r)
          comm_test::expect(theirs[static_cast<std::size_t>(peer)] == std::vector<int>(1000, peer), "the message of rank " + std::to_string(peer));
    });
    for (const auto& t : group) CHECK(connections_of(t) == n - 1);  // one link per pair, however they dialed
  }
  auto full = connect_group(n, comm_test::free_addresses(n), [](GroupOptions& options) { options.connect_on_demand = false; });
  for (const auto& t : full) CHECK(connections_of(t) == n - 1);
}

TEST_CASE("tcp: on demand, a rank's failure or a stuck rank reaches the ranks not linked to it, through the others", "[comm][tcp]") {
  constexpr int n = 6;
  for (const bool stuck : {false, true}) {
    INFO((stuck ? "rank 3 found stuck by rank 2" : "rank 3 announces its failure"));
    auto group = connect_group(n, comm_test::free_addresses(n));
    std::vector<int> out(1);
    std::vector<WorkPtr> pending;  // each rank waits on its ring neighbour, which never sends
    for (int r = 0; r < n; ++r) pending.push_back(group[static_cast<std::size_t>(r)]->recv((r + 1) % n, 5, conformance::bytes(out)));
    const std::string name = group[0]->describe(3);
    if (stuck) group[2]->declare_stuck(3, name + " is stuck: it never started collective 4");
    else group[3]->announce_failure("cannot write run/latest.ckpt: No space left on device");
    for (int r = 0; r < n; ++r) {
      if (stuck && r == 3) continue;  // it hears it too, but need not act on it
      INFO("rank " << r);
      const auto& work = pending[static_cast<std::size_t>(r)];
      if (stuck) CHECK_THROWS_WITH(work->wait(10s), Catch::Contains(name + " is stuck"));
      else CHECK_THROWS_WITH(work->wait(10s), Catch::Contains(name + " failed: cannot write run/latest.ckpt"));
    }
    for (int r = 0; r < n; ++r) CHECK(connections_of(group[static_cast<std::size_t>(r)]) == 2);
  }
}

TEST_CASE("tcp: on demand, a peer that cannot be reached after set-up is lost at the connect deadline, naming it", "[comm][tcp]") {
  // Rank 2 of 4 is hand-made: it authenticates with its ring neighbours 1 and 3 and listens nowhere, so that
  // rank 0's first message to it finds no listener.
  const auto addresses = comm_test::free_addresses(4);
  std::unique_ptr<Transport> zero, one, three;
  std::thread a([&] {
    GroupOptions options = options_for(0, addresses);
    options.connect_timeout = 1s;
    zero = connect_tcp(options);
  });
  std::thread b([&] { one = connect_tcp(options_for(1, addresses)); });
  std::thread d([&] { three = connect_tcp(options_for(3, addresses)); });
  RawClient to_one(addresses[1]);
  REQUIRE(handshake(to_one, 2, kSecret, tcp::random_nonce(), addresses, 1));
  RawClient to_three(addresses[3]);
  REQUIRE(handshake(to_three, 2, kSecret, tcp::random_nonce(), addresses, 3));
  pass_set_up_tokens(to_one, to_three);
  a.join();
  b.join();
  d.join();
  std::vector<int> value{1};
  const auto start = std::chrono::steady_clock::now();
  auto sent = zero->send(2, 1, conformance::bytes(value));
  CHECK_THROWS_WITH(sent->wait(10s), Catch::Contains("lost worker 2") && Catch::Contains("could not connect within 1000 ms"));
  CHECK(std::chrono::steady_clock::now() - start < 2500ms);
  // The others hear of it from rank 0.
  std::vector<int> out(1);
  CHECK_THROWS_WITH(one->recv(0, 1, conformance::bytes(out))->wait(5s), Catch::Contains("lost worker 2"));
}

TEST_CASE("load_secret reads COHORT_SECRET, then COHORT_SECRET_FILE", "[comm][tcp]") {
  ::setenv("COHORT_SECRET", "from-the-environment", 1);
  CHECK(load_secret() == "from-the-environment");
  ::unsetenv("COHORT_SECRET");
  const std::string path = "/tmp/cohort_test_secret_" + std::to_string(::getpid());
  { std::ofstream(path) << "from-a-secret-file\n"; }
  ::setenv("COHORT_SECRET_FILE", path.c_str(), 1);
  CHECK(load_secret() == "from-a-secret-file");
  ::unsetenv("COHORT_SECRET_FILE");
  std::remove(path.c_str());
  CHECK_THROWS_AS(load_secret(), InvalidArgument);
}

TEST_CASE("load_secret refuses COHORT_SECRET and COHORT_SECRET_FILE set together", "[comm][tcp]") {
  ::setenv("COHORT_SECRET", "from-the-environment", 1);
  ::setenv("COHORT_SECRET_FILE", "/nonexistent", 1);
  CHECK_THROWS_WITH(load_secret(), Catch::Contains("COHORT_SECRET and COHORT_SECRET_FILE are both set"));
  ::unsetenv("COHORT_SECRET");
  ::unsetenv("COHORT_SECRET_FILE");
}

TEST_CASE("load_secret refuses guessable secrets and secret files that are not files", "[comm][tcp]") {
  ::setenv("COHORT_SECRET", "x", 1);
  CHECK_THROWS_WITH(load_secret(), Catch::Contains("COHORT_SECRET has 1 characters") && Catch::Contains("at least 16"));
  ::unsetenv("COHORT_SECRET");
  ::setenv("COHORT_SECRET_FILE", "/tmp", 1);
  CHECK_THROWS_WITH(load_secret(), Catch::Contains("/tmp is not a readable file"));
  const std::string path = "/tmp/cohort_test_short_secret_" + std::to_string(::getpid());
  { std::ofstream(path) << "short\n"; }
  ::setenv("COHORT_SECRET_FILE", path.c_str(), 1);
  CHECK_THROWS_WITH(load_secret(), Catch::Contains("holds 5 characters"));
  ::unsetenv("COHORT_SECRET_FILE");
  std::remove(path.c_str());
}

namespace {

// Relays connections from dialers to `target`, keeping a copy of every byte that crosses it.
class RecordingRelay {
 public:
  explicit RecordingRelay(const Address& target) : target_(target), listener_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in own{};
    own.sin_family = AF_INET;
    own.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof own;
    REQUIRE(::bind(listener_, reinterpret_cast<sockaddr*>(&own), sizeof own) == 0);
    REQUIRE(::listen(listener_, 1) == 0);
    REQUIRE(::getsockname(listener_, reinterpret_cast<sockaddr*>(&own), &length) == 0);
    port_ = ntohs(own.sin_port);
    REQUIRE(::pipe(stop_) == 0);
    thread_ = std::thread([this] { relay(); });
  }
  ~RecordingRelay() {
    (void)::write(stop_[1], "x", 1);
    thread_.join();
    for (int fd : {listener_, stop_[0], stop_[1]}) ::close(fd);
  }
  Address address() const { return {"127.0.0.1", port_}; }
  std::string recorded() {
    const std::lock_guard lock(mutex_);
    return bytes_;
  }
  // Flips a bit in the next bytes the dialer sends, as a corrupting path would.
  void corrupt_next() { corrupt_ = true; }

 private:
  // Relays connections one after another until stopped; the target may start listening after the first
  // dialer arrives, so reaching it is retried.
  void relay() {
    for (;;) {
      pollfd waiting[2] = {{listener_, POLLIN, 0}, {stop_[0], POLLIN, 0}};
      if (::poll(waiting, 2, 10000) <= 0 || waiting[1].revents != 0) return;
      const int dialer = ::accept(listener_, nullptr, nullptr);
      if (dialer < 0) return;
      int upstream = -1;
      sockaddr_in target{};
      target.sin_family = AF_INET;
      target.sin_port = htons(target_.port);
      ::inet_pton(AF_INET, target_.host.c_str(), &target.sin_addr);
      for (int attempt = 0; attempt < 250 && upstream < 0; ++attempt) {
        upstream = ::socket(AF_INET, SOCK_STREAM, 0);
        if (::connect(upstream, reinterpret_cast<sockaddr*>(&target), sizeof target) != 0) {
          ::close(upstream);
          upstream = -1;
          std::this_thread::sleep_for(20ms);
        }
      }
      const bool stopped = upstream >= 0 && !pump(dialer, upstream);
      ::close(dialer);
      if (upstream >= 0) ::close(upstream);
      if (stopped) return;
    }
  }

  // Copies bytes both ways until a side closes (true) or the relay is stopped (false).
  bool pump(int dialer, int upstream) {
    for (;;) {
      pollfd fds[3] = {{dialer, POLLIN, 0}, {upstream, POLLIN, 0}, {stop_[0], POLLIN, 0}};
      if (::poll(fds, 3, 1000) < 0 || fds[2].revents != 0) return false;
      for (int side = 0; side < 2; ++side) {
        if (fds[side].revents == 0) continue;
        char buffer[65536];
        const ssize_t got = ::recv(fds[side].fd, buffer, sizeof buffer, 0);
        if (got <= 0) return true;
        {
          // Recorded before it is passed on, so that what the receiver has, the recording has.
          const std::lock_guard lock(mutex_);
          bytes_.append(buffer, static_cast<std::size_t>(got));
        }
        if (side == 0 && corrupt_.exchange(false)) buffer[got / 2] ^= 0x10;
        if (::send(fds[1 - side].fd, buffer, static_cast<std::size_t>(got), MSG_NOSIGNAL) != got) return true;
      }
    }
  }

  Address target_;
  int listener_;
  std::uint16_t port_ = 0;
  int stop_[2] = {-1, -1};
  std::mutex mutex_;
  std::string bytes_;
  std::atomic<bool> corrupt_{false};
  std::thread thread_;
};

}  // namespace

TEST_CASE("tcp over TLS: the conformance checks and the collectives", "[comm][tcp][tls]") {
  {
    const auto addresses = comm_test::free_addresses(3);
    auto group = connect_group(3, addresses, with_tls);
    conformance::ordering_and_tags(conformance::members_of(group));
    conformance::allreduce_matches_reference(conformance::members_of(group), {0, 1, 2, 7, 1000, 300001});
    conformance::broadcast_allgather_barrier(conformance::members_of(group));
  }
  {
    const auto addresses = comm_test::free_addresses(2);
    auto group = connect_group(2, addresses, with_tls);
    conformance::sizes_and_mismatch(conformance::members_of(group));
  }
  {
    const auto addresses = comm_test::free_addresses(2);
    auto group = connect_group(2, addresses, with_certificates("node"));
    conformance::broadcast_allgather_barrier(conformance::members_of(group));
  }
}

TEST_CASE("tcp over TLS: AES-128-GCM is the first choice of cipher suite", "[comm][tcp][tls]") {
  tcp::TlsContext tls({}, kSecret);
  STACK_OF(SSL_CIPHER)* suites = SSL_CTX_get_ciphers(tls.context().native_handle());
  REQUIRE(suites != nullptr);
  CHECK(std::string(SSL_CIPHER_get_name(sk_SSL_CIPHER_value(suites, 0))) == "TLS_AES_128_GCM_SHA256");
}

// Ranks 0 and 1, rank 0 reached at the relay's address, which forwards to where it listens (addresses[0]).
std::pair<std::unique_ptr<Transport>, std::unique_ptr<Transport>> connect_through(const RecordingRelay& relay,
                                                                                  const std::vector<Address>& addresses, bool tls) {
  const std::vector<Address> seen = {relay.address(), addresses[1]};
  auto zero_options = options_for(0, seen), one_options = options_for(1, seen);
  zero_options.listen_address = addresses[0];
  zero_options.tls.enabled = one_options.tls.enabled = tls;
  std::unique_ptr<Transport> zero;
  std::thread listener([&] { zero = connect_tcp(zero_options); });
  auto one = connect_tcp(one_options);
  listener.join();
  return {std::move(zero), std::move(one)};
}

TEST_CASE("tcp over TLS: the bytes on the wire are not the messages", "[comm][tcp][tls][security]") {
  const std::string marker = "a message that anybody on the path could read";
  for (const bool tls : {false, true}) {
    INFO("TLS " << tls);
    const auto addresses = comm_test::free_addresses(2);
    RecordingRelay relay(addresses[0]);
    auto linked = connect_through(relay, addresses, tls);
    auto& zero = linked.first;
    auto& one = linked.second;
    std::string message;
    for (int i = 0; i < 100; ++i) message += marker;
    std::string received(message.size(), '\0');
    auto sent = one->send(0, 3, std::as_bytes(std::span(message)));
    zero->recv(1, 3, std::as_writable_bytes(std::span(received)))->wait(5s);
    sent->wait(5s);
    CHECK(received == message);
    CHECK((relay.recorded().find(marker) != std::string::npos) == !tls);
  }
}

TEST_CASE("tcp over TLS: large messages both ways at once arrive whole, and a corrupted record fails the link naming the peer",
          "[comm][tcp][tls][security]") {
  const auto addresses = comm_test::free_addresses(2);
  RecordingRelay relay(addresses[0]);
  auto linked = connect_through(relay, addresses, true);
  auto& zero = linked.first;
  auto& one = linked.second;
  // Each side sends 8 MiB before it reads: many rings of records each way, neither side waiting on the other.
  const std::size_t count = std::size_t{2} << 20;
  std::vector<std::vector<int>> outgoing(2, std::vector<int>(count)), incoming(2, std::vector<int>(count, 0));
  for (std::size_t i = 0; i < count; ++i) outgoing[0][i] = static_cast<int>(i * 3), outgoing[1][i] = static_cast<int>(i * 5 + 1);
  Transport* ends[2] = {zero.get(), one.get()};
  comm_test::run_ranks(2, [&](int r) {
    const auto u = static_cast<std::size_t>(r);
    auto sent = ends[r]->send(1 - r, 5, conformance::bytes(outgoing[u]));
    ends[r]->recv(1 - r, 5, conformance::bytes(incoming[u]))->wait(10s);
    sent->wait(10s);
  });
  CHECK(incoming[0] == outgoing[1]);
  CHECK(incoming[1] == outgoing[0]);
  relay.corrupt_next();
  std::vector<int> message(16 * 1024, 7), received(message.size());
  const auto start = std::chrono::steady_clock::now();
  auto sent = one->send(0, 6, conformance::bytes(message));
  CHECK_THROWS_WITH(zero->recv(1, 6, conformance::bytes(received))->wait(5s),
                    Catch::Contains(zero->describe(1)) && Catch::Contains("bad record mac"));
  CHECK(std::chrono::steady_clock::now() - start < 3s);
  // The sender learns why from the alert the receiver sent before it let the connection go.
  CHECK_THROWS_WITH(one->recv(0, 7, conformance::bytes(received))->wait(5s),
                    Catch::Contains(one->describe(0)) && Catch::Contains("the peer ended TLS with the alert \"bad record mac\""));
}

TEST_CASE("tcp over TLS: another secret or an untrusted certificate fails set-up at once", "[comm][tcp][tls][security]") {
  const std::vector<std::pair<std::function<void(GroupOptions&)>, std::function<void(GroupOptions&)>>> mismatches = {
      {with_tls, [](GroupOptions& o) { o.tls.enabled = true; o.secret = "another secret, just as long"; }},
      {with_certificates("node"), with_certificates("stranger", "stranger-ca")},
  };
  for (const auto& mismatch : mismatches) {
    const auto& listener_side = mismatch.first;
    const auto& dialer_side = mismatch.second;
    const auto addresses = comm_test::free_addresses(2);
    std::unique_ptr<Transport> zero;
    std::thread listener([&] {
      auto options = options_for(0, addresses);
      listener_side(options);
      try {
        zero = connect_tcp(options);
      } catch (const TimeoutError&) {
      }
    });
    auto stranger = options_for(1, addresses);
    dialer_side(stranger);
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH(connect_tcp(stranger), Catch::Contains("cannot join: chief 0") && Catch::Contains("failed the TLS handshake"));
    CHECK(std::chrono::steady_clock::now() - start < 5s);
    // The listener goes on waiting for the rank it expects.
    auto legitimate = options_for(1, addresses);
    listener_side(legitimate);
    auto one = connect_tcp(legitimate);
    listener.join();
    REQUIRE(zero != nullptr);
    std::vector<int> ping{5}, pong(1);
    auto sent = one->send(0, 1, conformance::bytes(ping));
    zero->recv(1, 1, conformance::bytes(pong))->wait(5s);
    sent->wait(5s);
    CHECK(pong[0] == 5);
  }
}

TEST_CASE("tcp over TLS: unusable certificate files are named", "[comm][tcp][tls]") {
  const auto addresses = comm_test::free_addresses(2);
  auto options = options_for(0, addresses);
  with_certificates("node")(options);
  options.tls.private_key = "/nonexistent/node.key";
  CHECK_THROWS_WITH(connect_tcp(options), Catch::Contains("private key /nonexistent/node.key"));
  options = options_for(0, addresses);
  options.tls.certificate = COHORT_TEST_SOURCE_DIR "/comm/tls/node.pem";
  CHECK_THROWS_WITH(connect_tcp(options), Catch::Contains("not enabled"));
}

TEST_CASE("tcp: processes that disagree on TLS fail set-up at once, on the side that dials", "[comm][tcp][tls]") {
  for (const bool listener_encrypts : {true, false}) {
    INFO("the listener encrypts: " << listener_encrypts);
    const auto addresses = comm_test::free_addresses(2);
    std::unique_ptr<Transport> zero;
    std::string listener_error;
    std::thread listener([&] {
      auto options = options_for(0, addresses);
      options.tls.enabled = listener_encrypts;
      options.connect_timeout = 4s;
      try {
        zero = connect_tcp(options);
      } catch (const TimeoutError& e) {
        listener_error = e.what();
      }
    });
    auto dialer = options_for(1, addresses);
    dialer.tls.enabled = !listener_encrypts;
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH(connect_tcp(dialer), listener_encrypts ? Catch::Contains("this rank encrypts its connections")
                                                             : Catch::Contains("failed the TLS handshake"));
    CHECK(std::chrono::steady_clock::now() - start < 3s);
    listener.join();
    // The listener waits for a rank that could get in, and says at its deadline what it refused last.
    CHECK_THAT(listener_error, Catch::Contains("the last connection refused was from 127.0.0.1"));
    CHECK_THAT(listener_error, Catch::Contains(listener_encrypts ? "COHORT_TLS differs" : "it speaks TLS"));
  }
}
