#include "handshake.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cohort/core/error.hpp"

namespace cohort::comm::tcp {
namespace {

Mac hmac(const std::string& secret, const char* role, const Nonce& first, const Nonce& second, int client_rank,
         int server_rank) {
  std::vector<unsigned char> message(role, role + std::strlen(role));
  message.insert(message.end(), reinterpret_cast<const unsigned char*>(first.data()),
                 reinterpret_cast<const unsigned char*>(first.data()) + first.size());
  message.insert(message.end(), reinterpret_cast<const unsigned char*>(second.data()),
                 reinterpret_cast<const unsigned char*>(second.data()) + second.size());
  for (int rank : {client_rank, server_rank})
    for (int i = 0; i < 4; ++i) message.push_back(static_cast<unsigned char>((static_cast<unsigned>(rank) >> (8 * i)) & 0xff));
  Mac out{};
  std::size_t length = 0;
  if (EVP_Q_mac(nullptr, "HMAC", nullptr, "SHA256", nullptr, secret.data(), secret.size(), message.data(), message.size(),
                reinterpret_cast<unsigned char*>(out.data()), out.size(), &length) == nullptr ||
      length != out.size())
    throw IoError("HMAC-SHA256 failed in OpenSSL");
  return out;
}

}  // namespace

HelloBytes encode_hello(const Hello& hello) {
  HelloBytes out{};
  std::copy(hello.nonce.begin(), hello.nonce.end(), out.begin());
  put_le(out, kNonceBytes, hello.server_rank);
  put_le(out, kNonceBytes + 4, hello.layout);
  put_le(out, kNonceBytes + 12, hello.heartbeat_ms);
  put_le(out, kNonceBytes + 16, hello.peer_timeout_ms);
  put_le(out, kNonceBytes + 20, hello.timeout_ms);
  return out;
}

Hello decode_hello(const HelloBytes& bytes) {
  Hello hello;
  std::copy_n(bytes.begin(), kNonceBytes, hello.nonce.begin());
  hello.server_rank = get_le<std::uint32_t>(bytes, kNonceBytes);
  hello.layout = get_le<std::uint64_t>(bytes, kNonceBytes + 4);
  hello.heartbeat_ms = get_le<std::uint32_t>(bytes, kNonceBytes + 12);
  hello.peer_timeout_ms = get_le<std::uint32_t>(bytes, kNonceBytes + 16);
  hello.timeout_ms = get_le<std::uint32_t>(bytes, kNonceBytes + 20);
  return hello;
}

std::uint64_t layout_fingerprint(const std::vector<std::string>& endpoints) {
  std::string text = std::to_string(endpoints.size());
  for (const auto& endpoint : endpoints) text += "|" + endpoint;
  std::uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

Mac tls_key(const std::string& secret) {
  static constexpr char kLabel[] = "cohort TLS 1.3 pre-shared key, version 1";
  Mac out{};
  std::size_t length = 0;
  if (EVP_Q_mac(nullptr, "HMAC", nullptr, "SHA256", nullptr, secret.data(), secret.size(),
                reinterpret_cast<const unsigned char*>(kLabel), sizeof kLabel - 1, reinterpret_cast<unsigned char*>(out.data()),
                out.size(), &length) == nullptr ||
      length != out.size())
    throw IoError("HMAC-SHA256 failed in OpenSSL");
  return out;
}

Nonce random_nonce() {
  Nonce nonce{};
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(nonce.size())) != 1)
    throw IoError("OpenSSL's random generator failed");
  return nonce;
}

Mac server_proof(const std::string& secret, const Nonce& client, const Nonce& server, int client_rank, int server_rank) {
  return hmac(secret, "cohort server", client, server, client_rank, server_rank);
}

Mac client_proof(const std::string& secret, const Nonce& client, const Nonce& server, int client_rank, int server_rank) {
  return hmac(secret, "cohort client", server, client, client_rank, server_rank);
}

bool same(const Mac& a, const Mac& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

}  // namespace cohort::comm::tcp
