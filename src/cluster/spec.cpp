#include "cohort/cluster/spec.hpp"

#include <algorithm>

#include <fmt/format.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <charconv>
#include <map>

#include "cohort/core/check.hpp"

namespace cohort::cluster {
namespace {

const std::vector<Endpoint>& members(const ClusterSpec& spec, Role role) {
  switch (role) {
    case Role::Chief: return spec.chief;
    case Role::Worker: return spec.workers;
    case Role::Ps: return spec.ps;
  }
  throw InvalidArgument("unknown role");
}

// The addresses `host` stands for ("localhost": 127.0.0.1 and ::1; "127.000.000.001": 127.0.0.1), or the
// name itself where it does not resolve here (a host of another network).
std::vector<std::string> addresses_of(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return {host};
  std::vector<std::string> addresses;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    int family = a->ai_family;
    const void* raw = family == AF_INET ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr)
                                        : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr);
    // "::ffff:127.0.0.1" is 127.0.0.1.
    if (family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(static_cast<const in6_addr*>(raw))) {
      raw = static_cast<const std::byte*>(raw) + 12;
      family = AF_INET;
    }
    if (::inet_ntop(family, raw, text, sizeof text) != nullptr) addresses.emplace_back(text);
  }
  ::freeaddrinfo(found);
  if (addresses.empty()) addresses.push_back(host);
  return addresses;
}

}  // namespace

std::string role_name(Role role) {
  switch (role) {
    case Role::Chief: return "chief";
    case Role::Worker: return "worker";
    case Role::Ps: return "ps";
  }
  return "unknown";
}

std::string Endpoint::to_string() const {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
}

Endpoint parse_endpoint(const std::string& text, const std::string& what) {
  std::string host, port;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      throw InvalidArgument(fmt::format("{}: '{}' is not [address]:port", what, text));
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string::npos || text.find(':') != colon)
      throw InvalidArgument(fmt::format("{}: '{}' is not host:port", what, text));
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (host.empty()) throw InvalidArgument(fmt::format("{}: '{}' has no host", what, text));
  unsigned value = 0;
  const auto [end, error] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (error != std::errc() || end != port.data() + port.size() || value == 0 || value > 65535)
    throw InvalidArgument(fmt::format("{}: '{}' has no valid port (1-65535)", what, text));
  return {host, static_cast<std::uint16_t>(value)};
}

void ClusterSpec::validate() const {
  if (chief.size() > 1)
    throw InvalidArgument(fmt::format("{}: cluster.chief has {} entries; at most one chief", source, chief.size()));
  if (chief.empty() && workers.empty())
    throw InvalidArgument(fmt::format("{}: the cluster has neither a chief nor a worker", source));
  const auto& mine = members(*this, role);
  if (index < 0 || index >= static_cast<int>(mine.size()))
    throw InvalidArgument(fmt::format("{}: task index {} is outside cluster.{} (which has {} entries)", source, index,
                                      role_name(role), mine.size()));
  // Compared after resolution: "localhost:P" and "127.0.0.1:P" are one listening address, and two tasks
  // cannot both listen there.
  std::map<std::string, std::vector<std::string>> resolved;
  struct Listed {
    std::string task;      // "cluster.worker[0]"
    std::string endpoint;  // as given
  };
  std::map<std::pair<std::string, std::uint16_t>, Listed> seen;  // by (address, port)
  for (Role r : {Role::Chief, Role::Worker, Role::Ps}) {
    const auto& list = members(*this, r);
    for (std::size_t i = 0; i < list.size(); ++i) {
      const Listed here{fmt::format("cluster.{}[{}]", role_name(r), i), list[i].to_string()};
      auto [at, fresh] = resolved.try_emplace(list[i].host);
      if (fresh) at->second = addresses_of(list[i].host);
      for (const std::string& address : at->second) {
        // The list says where the others dial each task; nobody can dial "every address".
        if (address == "0.0.0.0" || address == "::")
          throw InvalidArgument(fmt::format("{}: {} = {} is not an address another process can dial ({} means every "
                                            "address of a host): give the address the others reach this task at "
                                            "(127.0.0.1 when all run on one host)",
                                            source, here.task, here.endpoint, address));
        const auto [earlier, added] = seen.try_emplace({address, list[i].port}, here);
        if (added) continue;
        const Listed& other = earlier->second;
        throw InvalidArgument(other.endpoint == here.endpoint
                                  ? fmt::format("{}: {} = {} is listed twice (also {})", source, here.task, here.endpoint, other.task)
                                  : fmt::format("{}: {} = {} is listed twice: {} = {} is the same address ({} port {})", source,
                                                here.task, here.endpoint, other.task, other.endpoint, address, list[i].port));
      }
    }
  }
}

int ClusterSpec::world_size() const { return static_cast<int>(chief.size() + workers.size() + ps.size()); }

int ClusterSpec::rank_of(Role r, int i) const {
  COHORT_CHECK(i >= 0 && i < static_cast<int>(members(*this, r).size()), "{} {} is not in the cluster", role_name(r), i);
  switch (r) {
    case Role::Chief: return i;
    case Role::Worker: return static_cast<int>(chief.size()) + i;
    case Role::Ps: return static_cast<int>(chief.size() + workers.size()) + i;
  }
  return -1;
}

std::pair<Role, int> ClusterSpec::task_of(int rank) const {
  COHORT_CHECK(rank >= 0 && rank < world_size(), "rank {} outside a cluster of {}", rank, world_size());
  int r = rank;
  for (Role role_kind : {Role::Chief, Role::Worker, Role::Ps}) {
    const int count = static_cast<int>(members(*this, role_kind).size());
    if (r < count) return {role_kind, r};
    r -= count;
  }
  return {Role::Ps, r};
}

const Endpoint& ClusterSpec::endpoint(int rank) const {
  const auto [r, i] = task_of(rank);
  return members(*this, r)[static_cast<std::size_t>(i)];
}

bool ClusterSpec::is_chief() const { return role == Role::Chief || (chief.empty() && role == Role::Worker && index == 0); }

std::string ClusterSpec::describe(int rank) const {
  const auto [r, i] = task_of(rank);
  return fmt::format("{} {} ({})", role_name(r), i, endpoint(rank).to_string());
}

std::vector<int> ClusterSpec::host_of() const {
  std::vector<std::string> hosts;
  std::vector<int> of;
  for (int rank = 0; rank < world_size(); ++rank) {
    const std::string& host = endpoint(rank).host;
    const auto known = std::find(hosts.begin(), hosts.end(), host);
    of.push_back(static_cast<int>(known - hosts.begin()));
    if (known == hosts.end()) hosts.push_back(host);
  }
  return of;
}

}  // namespace cohort::cluster
