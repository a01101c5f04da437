#pragma once
// Mutual authentication by a shared secret (OpenSSL's HMAC-SHA256 and random generator):
//   client -> server  Hello:     client nonce Nc, the rank it expects to reach
//   server -> client  Challenge: server nonce Ns
//   client -> server  Response:  HMAC(secret, "client" | Ns | Nc | ranks)
//   server -> client  Accepted:  HMAC(secret, "server" | Nc | Ns | ranks); or Refused: a wrong proof, or
//                                how the client's cluster list or deadlines differ
// Each side proves knowledge of the secret over the other side's fresh nonce, so a recorded handshake
// replayed later fails against the new nonce. The dialer proves first: a stranger who connects gets
// nothing computed from the secret to test guesses against offline. Before the Response a listener
// explains only an impossible rank or address, so a stranger learns nothing of the group.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "frame.hpp"

namespace cohort::comm::tcp {

using Nonce = std::array<std::byte, kNonceBytes>;
using Mac = std::array<std::byte, kMacBytes>;

// What a dialer says before any proof (the Hello frame's payload; its tag is the dialer's rank): whom it
// dialed, and the settings that every process of a group must share, so that a process configured unlike
// the others is told at once instead of failing later, or worse, working with the wrong peers.
struct Hello {
  Nonce nonce{};
  std::uint32_t server_rank = 0;
  std::uint64_t layout = 0;  // layout_fingerprint() of the group's addresses; 0 in a star group (a rendezvous)
  std::uint32_t heartbeat_ms = 0;
  std::uint32_t peer_timeout_ms = 0;
  std::uint32_t timeout_ms = 0;  // COHORT_TIMEOUT: how long a peer may make no progress
};
inline constexpr std::size_t kHelloBytes = kNonceBytes + 4 + 8 + 4 + 4 + 4;
using HelloBytes = std::array<std::byte, kHelloBytes>;
HelloBytes encode_hello(const Hello& hello);
Hello decode_hello(const HelloBytes& bytes);
// FNV-1a over "N|host:port|host:port|...", one per rank in rank order, as the processes were given them.
std::uint64_t layout_fingerprint(const std::vector<std::string>& endpoints);

Nonce random_nonce();
Mac server_proof(const std::string& secret, const Nonce& client, const Nonce& server, int client_rank, int server_rank);
Mac client_proof(const std::string& secret, const Nonce& client, const Nonce& server, int client_rank, int server_rank);
// Constant-time comparison.
bool same(const Mac& a, const Mac& b);
// The TLS pre-shared key of a group: HMAC-SHA256 of a fixed label under the secret, so that the secret
// itself never keys two protocols.
Mac tls_key(const std::string& secret);

}  // namespace cohort::comm::tcp
