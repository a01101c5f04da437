// The TCP transport's wire on any bytes: the frame header decoder, and a live listener (rank 0 of a group
// of 2 still waiting for rank 1) fed each input as one connection's bytes. The listener must refuse and
// close every such connection within its handshake deadline and go on listening; a crash, a sanitizer
// report or a connection held open is a finding.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

#include "cohort/comm/tcp.hpp"
#include "comm/tcp/frame.hpp"
#include "comm/tcp/handshake.hpp"
#include "fuzz_util.hpp"

using namespace cohort;

namespace {

std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0)
    std::abort();
  ::close(fd);
  return ntohs(address.sin_port);
}

// Rank 0 listening for a rank 1 that never comes: set-up runs for the whole fuzzing session.
struct Listener {
  comm::Address address{"127.0.0.1", free_port()};
  Listener() {
    std::thread([address = address] {
      // The group's addresses are fixed (so the seeds' hellos match every run); rank 0 listens elsewhere.
      comm::GroupOptions options{.rank = 0, .addresses = {{"127.0.0.1", 1}, {"127.0.0.1", 2}}, .listen_address = address,
                               .secret = "a secret for fuzzing only"};
      options.connect_timeout = std::chrono::hours(24);
      try {
        comm::connect_tcp(options);
      } catch (...) {
        std::abort();  // the listener gave up: a stranger's bytes ended set-up
      }
    }).detach();
  }
};

const Listener& wire_listener() {
  static Listener listener;
  return listener;
}

// libFuzzer's timeout alarm (SIGALRM, without SA_RESTART) interrupts whichever call is blocked when it
// fires: an interrupted call is tried again, never taken for the listener's answer.
void through_listener(const Listener& listener, std::string_view bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in target{};
  target.sin_family = AF_INET;
  target.sin_port = htons(listener.address.port);
  ::inet_pton(AF_INET, listener.address.host.c_str(), &target.sin_addr);
  bool connected = false;
  for (int attempt = 0; attempt < 500 && !connected; ++attempt) {
    connected = ::connect(fd, reinterpret_cast<sockaddr*>(&target), sizeof target) == 0 || errno == EISCONN;
    if (!connected && errno != EINTR && errno != EALREADY) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!connected) std::abort();  // the listener stopped listening
  for (std::size_t sent = 0; sent < bytes.size();) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n > 0) sent += static_cast<std::size_t>(n);
    else if (errno != EINTR) break;  // the listener hung up early: its answer is still read below
  }
  ::shutdown(fd, SHUT_WR);
  // The listener must close its side once our bytes end, long before its 10 s handshake deadline.
  timeval timeout{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  char sink[4096];
  for (ssize_t got; (got = ::recv(fd, sink, sizeof sink, 0)) != 0;) {
    if (got > 0 || errno == EINTR) continue;
    if (errno == ECONNRESET) break;
    if ((errno != EAGAIN && errno != EWOULDBLOCK) || std::chrono::steady_clock::now() > deadline) std::abort();
  }
  ::close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  using namespace comm::tcp;
  const auto frame = [](FrameType type, std::uint64_t tag, std::string payload) {
    const HeaderBytes header = encode({.type = type, .tag = tag, .length = payload.size()});
    return std::string(reinterpret_cast<const char*>(header.data()), header.size()) + payload;
  };
  // A hello from rank 1 to rank 0 with the listener's settings, and the other frames of the protocol.
  const HelloBytes payload = encode_hello({.server_rank = 0,
                                           .layout = layout_fingerprint({"127.0.0.1:1", "127.0.0.1:2"}),
                                           .heartbeat_ms = 1000, .peer_timeout_ms = 10000, .timeout_ms = 60000});
  const std::string hello = frame(FrameType::Hello, 1, std::string(reinterpret_cast<const char*>(payload.data()), payload.size()));
  fuzz::write_seeds({fuzz::mode(0, frame(FrameType::Data, 7, "")), fuzz::mode(0, frame(FrameType::Abort, 2, "")),
                     fuzz::mode(0, frame(FrameType::Announce, 1 << 20, "")),
                     fuzz::mode(1, hello), fuzz::mode(1, hello + frame(FrameType::Response, 0, std::string(kMacBytes, 'm'))),
                     fuzz::mode(1, frame(FrameType::Data, 1, "data before a handshake"))});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const Listener& listener = wire_listener();
  if (size == 0) return 0;
  const std::string_view bytes = fuzz::rest(data, size);
  if (data[0] % 2 == 0) {
    comm::tcp::HeaderBytes header{};
    std::copy_n(bytes.begin(), std::min(bytes.size(), header.size()), reinterpret_cast<char*>(header.data()));
    (void)comm::tcp::check(comm::tcp::decode(header), std::uint64_t{1} << 32);
  } else {
    through_listener(listener, bytes);
  }
  return 0;
}
