#pragma once
// What every transport of a group is made from, whichever carries the bytes (transports.hpp): who the
// ranks are and where they are reached, the shared secret that authenticates them, the deadlines, how
// connections are made, and encryption of the links between processes.
//
//   comm::GroupOptions options{.rank = 1, .addresses = {{"127.0.0.1", 4000}, {"127.0.0.1", 4001}},
//                              .secret = comm::load_secret()};
//   auto transport = comm::connect_transport("shared-memory", options);

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

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

struct GroupOptions {
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
  // A transport that can read a peer's memory directly (shared memory) does so for large messages, one
  // copy; false: every message is copied through its buffers.
  bool single_copy = true;
  TlsOptions tls;
};

}  // namespace cohort::comm
