#pragma once
// The TCP transport: one connection per pair of ranks that talk, over standalone Asio, authenticated by a
// shared secret (HMAC-SHA256 challenge-response in both directions), with length-prefixed frames,
// heartbeats and a deadline on everything. Only the factory is public; the implementation lives in
// src/comm/tcp/.
//
//   comm::TcpOptions options{.rank = 1, .addresses = {{"127.0.0.1", 4000}, {"127.0.0.1", 4001}},
//                            .secret = comm::load_secret()};
//   auto transport = comm::connect_tcp(options);   // returns once every rank has come

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/comm/transport.hpp"

namespace cohort::comm {

struct Address {
  std::string host;
  std::uint16_t port = 0;
};

// Encryption of every connection (TLS 1.3). Without certificates the key comes from the shared secret
// (TLS-PSK), so nothing else needs distributing; with them, each side proves its certificate against the CA
// (mutual TLS). The secret's handshake runs inside TLS too, so a process needs both.
struct TlsOptions {
  bool enabled = false;
  std::string certificate;  // PEM certificate chain of this process (with private_key and ca, or none of them)
  std::string private_key;  // PEM
  std::string ca;           // PEM certificates that peers' certificates must chain to
};

struct TcpOptions {
  int rank = 0;
  std::vector<Address> addresses;  // one per rank, alike in every process; this rank listens on its own, on that host only
  // Listen here instead (behind a relay or NAT that forwards addresses[rank] to it).
  std::optional<Address> listen_address;
  std::vector<std::string> names;  // how errors name each rank; default "rank N (host:port)"
  std::string secret;              // shared by all ranks; an empty secret is refused
  // Connecting: peers may start in any order; dialing retries with back-off until this deadline.
  std::chrono::milliseconds connect_timeout{60000};
  // The deadline collectives apply to each wait.
  std::chrono::milliseconds timeout{60000};
  // A heartbeat goes out this often; a peer silent for peer_timeout is declared lost.
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds peer_timeout{10000};
  // Frames above this size are a protocol violation.
  std::uint64_t max_frame_bytes = std::uint64_t{1} << 32;
  // Star: only rank 0 listens and every other rank connects to it alone (a rendezvous); rank 0 may then
  // talk to everybody, the others only to rank 0.
  bool star = false;
  // Connections on demand: set-up connects each rank to its two ring neighbours only, and returns once a
  // token passed around that ring shows every rank up and configured alike; any other pair connects at its
  // first message either way. A group holds the links its pattern uses (a ring, log2 n partners, workers
  // to servers) rather than n (n - 1) / 2. false: every pair connects at set-up.
  bool connect_on_demand = true;
  TlsOptions tls;
};

// Blocks until this rank is connected to and authenticated with its ring neighbours (every other rank
// without connect_on_demand) and every rank of the group has come. Throws TimeoutError naming the peers
// still missing at the deadline, InvalidArgument for bad options. Later, a peer that cannot be reached
// within connect_timeout is lost.
std::unique_ptr<Transport> connect_tcp(const TcpOptions& options);

// How many peers `transport`, made by connect_tcp(), holds a connection to now; none for another transport.
std::optional<int> connections_of(const Transport& transport);

// Makes a group's transport from its peers' addresses, names, secret and deadlines: connect_tcp, or
// another transport for the same group (shared memory between peers on one host).
using TransportFactory = std::function<std::unique_ptr<Transport>(const TcpOptions& options)>;

// Reads a variable of an environment: the process's, or one an application builds.
using VariableLookup = std::function<std::optional<std::string>(const std::string& name)>;

// The shared secret: COHORT_SECRET, else the contents of the file named by COHORT_SECRET_FILE, as
// `variable` (by default the process's environment) gives them. Throws InvalidArgument when neither is
// set (naming `source`, where `variable` looks), both are, or the secret is too short to be one.
std::string load_secret(const VariableLookup& variable, std::string_view source = "this process's environment");
std::string load_secret();

}  // namespace cohort::comm
