#pragma once
// Mutual authentication by a shared secret (OpenSSL's HMAC-SHA256 and random generator):
//   client -> server  Hello:     client nonce Nc, the rank it expects to reach
//   server -> client  Challenge: server nonce Ns, HMAC(secret, "server" | Nc | Ns | ranks)
//   client -> server  Response:  HMAC(secret, "client" | Ns | Nc | ranks)
// Each side proves knowledge of the secret over the other side's fresh nonce, so a recorded handshake
// replayed later fails against the new nonce.

#include <array>
#include <cstddef>
#include <string>

#include "frame.hpp"

namespace cohort::comm::tcp {

using Nonce = std::array<std::byte, kNonceBytes>;
using Mac = std::array<std::byte, kMacBytes>;

Nonce random_nonce();
Mac server_proof(const std::string& secret, const Nonce& client, const Nonce& server, int client_rank, int server_rank);
Mac client_proof(const std::string& secret, const Nonce& client, const Nonce& server, int client_rank, int server_rank);
// Constant-time comparison.
bool same(const Mac& a, const Mac& b);
// The TLS pre-shared key of a group: HMAC-SHA256 of a fixed label under the secret, so that the secret
// itself never keys two protocols.
Mac tls_key(const std::string& secret);

}  // namespace cohort::comm::tcp
