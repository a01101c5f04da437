#pragma once
// The keys of a TLS 1.3 connection's records, taken from OpenSSL once its handshake is over, so that the
// records are protected outside OpenSSL, as the kernel's TLS offload takes them. OpenSSL hands out the
// application traffic secrets through its key log callback (the only way it gives them); the key and IV of
// each direction are derived from them as RFC 8446 section 7.3 says, and so are the next ones at a KeyUpdate.
#include <openssl/ssl.h>

#include <vector>

#include "record_cipher.hpp"

namespace cohort::comm::tcp {

struct TrafficKeys {
  TrafficKeys() = default;
  TrafficKeys(const TrafficKeys&) = delete;
  TrafficKeys& operator=(const TrafficKeys&) = delete;
  TrafficKeys(TrafficKeys&&) = default;
  TrafficKeys& operator=(TrafficKeys&& other) noexcept;  // wipes the keys it replaces
  ~TrafficKeys();

  CipherSuite suite = CipherSuite::Aes128Gcm;
  std::vector<unsigned char> secret;  // the next generation's keys come from it
  std::vector<unsigned char> key;
  AeadNonce iv{};

 private:
  void wipe();
};

// The key and IV of `secret` for `suite`.
TrafficKeys traffic_keys(CipherSuite suite, std::vector<unsigned char> secret);
// The generation after `keys`, which a KeyUpdate message switches to.
TrafficKeys next_generation(const TrafficKeys& keys);

// Makes every connection of `context` keep its application traffic secrets, for connection_keys(). Each
// connection must be made ready with keep_traffic_secrets(SSL*) before its handshake.
void keep_traffic_secrets(SSL_CTX* context);
void keep_traffic_secrets(SSL* ssl);

struct ConnectionKeys {
  TrafficKeys sending;
  TrafficKeys receiving;
};
// The keys of a connection whose handshake is over. Throws ProtocolError when its suite is not one of
// TLS 1.3's three or OpenSSL gave no secrets.
ConnectionKeys connection_keys(SSL* ssl);

}  // namespace cohort::comm::tcp
