#include "cohort/cluster/rendezvous.hpp"

#include "cohort/comm/tcp.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cereal/archives/portable_binary.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>
#include <cstring>
#include <sstream>

#include "cohort/comm/collectives.hpp"
#include "cohort/core/error.hpp"
#include "core/bounded_archive.hpp"

namespace cohort::cluster {
namespace {

constexpr comm::Tag kRendezvousTag = 0x52454E4445000000ull;  // "RENDE"

// A free TCP port on `host`: bound to port 0, read back, released for the transport to take.
std::uint16_t free_port(const std::string& host) {
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (::getaddrinfo(host.c_str(), "0", &hints, &found) != 0 || found == nullptr)
    throw InvalidArgument(fmt::format("rendezvous: cannot resolve this process's address '{}'", host));
  const int fd = ::socket(found->ai_family, SOCK_STREAM, 0);
  const bool bound = fd >= 0 && ::bind(fd, found->ai_addr, found->ai_addrlen) == 0;
  ::freeaddrinfo(found);
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  if (!bound || ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    if (fd >= 0) ::close(fd);
    throw IoError(fmt::format("rendezvous: cannot bind a port on '{}': {}", host, std::strerror(errno)));
  }
  ::close(fd);
  return ntohs(address.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&address)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&address)->sin_port);
}

void send_text(comm::Transport& transport, int peer, const std::string& text);
std::string receive_text(comm::Transport& transport, int peer);

// Control messages are cereal archives, sent as a size and then the bytes.
template <typename... Values>
void send_message(comm::Transport& transport, int peer, const Values&... values) {
  std::ostringstream stream;
  {
    cereal::PortableBinaryOutputArchive archive(stream);
    archive(values...);
  }
  send_text(transport, peer, stream.str());
}

template <typename... Values>
void receive_message(comm::Transport& transport, int peer, Values&... values) {
  const std::string bytes = receive_text(transport, peer);
  try {
    BoundedInputArchive archive(bytes);
    archive(values...);
  } catch (const cereal::Exception& e) {
    throw ProtocolError(fmt::format("rendezvous: a garbled message from rank {}: {}", peer, e.what()));
  }
}

void send_text(comm::Transport& transport, int peer, const std::string& text) {
  const std::uint64_t size = text.size();
  auto header = transport.send(peer, kRendezvousTag, std::as_bytes(std::span(&size, 1)));
  auto body = transport.send(peer, kRendezvousTag, std::as_bytes(std::span(text.data(), text.size())));
  comm::wait_all({header, body}, transport.timeout());
}

std::string receive_text(comm::Transport& transport, int peer) {
  std::uint64_t size = 0;
  transport.recv(peer, kRendezvousTag, std::as_writable_bytes(std::span(&size, 1)))->wait(transport.timeout());
  if (size > (1u << 24)) throw ProtocolError(fmt::format("rendezvous: a {}-byte message from rank {}", size, peer));
  std::string text(size, '\0');
  transport.recv(peer, kRendezvousTag, std::as_writable_bytes(std::span(text.data(), text.size())))->wait(transport.timeout());
  return text;
}

}  // namespace

ClusterSpec rendezvous(const RendezvousRequest& request, const std::string& secret, const std::string& own_host,
                       const ConnectOptions& options) {
  const int n = request.world_size, rank = request.rank;
  const std::string where = fmt::format("{} rendezvous at {}", request.source, request.chief.to_string());
  // The mesh address this process will listen on later.
  const Endpoint mine{own_host, free_port(own_host)};

  std::vector<std::string> addresses(static_cast<std::size_t>(n));
  int num_ps = request.num_ps;
  {
    comm::GroupOptions star;
    star.rank = rank;
    star.star = true;
    star.secret = secret;
    star.connect_timeout = options.connect_timeout;
    star.timeout = options.timeout;
    star.heartbeat_interval = options.heartbeat_interval;
    star.peer_timeout = options.peer_timeout;
    star.tls = options.tls;
    for (int r = 0; r < n; ++r) {
      // Only rank 0's address is dialed; the others are names for messages.
      star.addresses.push_back(r == 0 ? comm::Address{request.chief.host, request.chief.port} : comm::Address{own_host, 1});
      star.names.push_back(r == 0 ? fmt::format("rank 0 ({})", request.chief.to_string()) : fmt::format("rank {}", r));
    }
    auto transport = comm::connect_tcp(star);
    if (rank == 0) {
      addresses[0] = mine.to_string();
      for (int r = 1; r < n; ++r) receive_message(*transport, r, addresses[static_cast<std::size_t>(r)]);
      for (int r = 1; r < n; ++r) send_message(*transport, r, num_ps, addresses);
    } else {
      send_message(*transport, 0, mine.to_string());
      receive_message(*transport, 0, num_ps, addresses);
      if (static_cast<int>(addresses.size()) != n)
        throw ProtocolError(fmt::format("{}: rank 0 sent {} addresses for {} ranks", where, addresses.size(), n));
    }
  }
  if (num_ps < 0 || num_ps >= n)
    throw InvalidArgument(fmt::format("{}: COHORT_NUM_PS = {} leaves no worker among {} ranks", where, num_ps, n));

  ClusterSpec spec;
  spec.source = where;
  for (int r = 0; r < n; ++r) {
    const Endpoint endpoint = parse_endpoint(addresses[static_cast<std::size_t>(r)], fmt::format("{}: rank {}", where, r));
    if (r == 0) spec.chief.push_back(endpoint);
    else if (r < n - num_ps) spec.workers.push_back(endpoint);
    else spec.ps.push_back(endpoint);
  }
  if (rank == 0) {
    spec.role = Role::Chief;
    spec.index = 0;
  } else if (rank < n - num_ps) {
    spec.role = Role::Worker;
    spec.index = rank - 1;
  } else {
    spec.role = Role::Ps;
    spec.index = rank - (n - num_ps);
  }
  spec.validate();
  return spec;
}

}  // namespace cohort::cluster
