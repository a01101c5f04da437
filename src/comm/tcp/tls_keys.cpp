#include "tls_keys.hpp"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/kdf.h>

#include <cstring>
#include <memory>
#include <string_view>

#include "cohort/core/error.hpp"

namespace cohort::comm::tcp {
namespace {

struct Secrets {
  std::vector<unsigned char> client, server;
  ~Secrets() {
    OPENSSL_cleanse(client.data(), client.size());
    OPENSSL_cleanse(server.data(), server.size());
  }
};

void free_secrets(void*, void* secrets, CRYPTO_EX_DATA*, int, long, void*) { delete static_cast<Secrets*>(secrets); }

int secrets_slot() {
  static const int slot = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, &free_secrets);
  return slot;
}

// "CLIENT_TRAFFIC_SECRET_0 <client random> <secret>", both in hex, as NSS's key log format has it.
void note_secret(const SSL* ssl, const char* line) {
  auto* secrets = static_cast<Secrets*>(SSL_get_ex_data(ssl, secrets_slot()));
  if (secrets == nullptr) return;
  const std::string_view text(line);
  const std::size_t label_end = text.find(' ');
  const std::size_t random_end = text.find(' ', label_end + 1);
  if (label_end == std::string_view::npos || random_end == std::string_view::npos) return;
  const std::string_view label = text.substr(0, label_end);
  std::vector<unsigned char>* into = label == "CLIENT_TRAFFIC_SECRET_0"   ? &secrets->client
                                     : label == "SERVER_TRAFFIC_SECRET_0" ? &secrets->server
                                                                           : nullptr;
  if (into == nullptr) return;
  const char* hex = line + random_end + 1;
  into->resize(std::strlen(hex) / 2);
  std::size_t length = 0;
  if (OPENSSL_hexstr2buf_ex(into->data(), into->size(), &length, hex, '\0') != 1) length = 0;
  into->resize(length);
}

const char* digest_of(CipherSuite suite) { return suite == CipherSuite::Aes256Gcm ? "SHA384" : "SHA256"; }

// HKDF-Expand-Label(secret, label, "", length) of RFC 8446 section 7.1, through OpenSSL's TLS13-KDF.
std::vector<unsigned char> expand_label(CipherSuite suite, const std::vector<unsigned char>& secret, std::string_view label,
                                        std::size_t length) {
  struct FreeKdf {
    void operator()(EVP_KDF* kdf) const { EVP_KDF_free(kdf); }
    void operator()(EVP_KDF_CTX* context) const { EVP_KDF_CTX_free(context); }
  };
  const std::unique_ptr<EVP_KDF, FreeKdf> kdf(EVP_KDF_fetch(nullptr, "TLS13-KDF", nullptr));
  const std::unique_ptr<EVP_KDF_CTX, FreeKdf> context(kdf ? EVP_KDF_CTX_new(kdf.get()) : nullptr);
  if (!context) throw IoError("OpenSSL has no TLS13-KDF");
  int mode = EVP_KDF_HKDF_MODE_EXPAND_ONLY;
  static constexpr char kPrefix[] = "tls13 ";
  const OSSL_PARAM params[] = {
      OSSL_PARAM_construct_int(OSSL_KDF_PARAM_MODE, &mode),
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, const_cast<char*>(digest_of(suite)), 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, const_cast<unsigned char*>(secret.data()), secret.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_PREFIX, const_cast<char*>(kPrefix), sizeof kPrefix - 1),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_LABEL, const_cast<char*>(label.data()), label.size()),
      OSSL_PARAM_construct_end(),
  };
  std::vector<unsigned char> out(length);
  if (EVP_KDF_derive(context.get(), out.data(), out.size(), params) != 1) throw IoError("OpenSSL failed to derive TLS record keys");
  return out;
}

}  // namespace

void TrafficKeys::wipe() {
  OPENSSL_cleanse(secret.data(), secret.size());
  OPENSSL_cleanse(key.data(), key.size());
}

TrafficKeys& TrafficKeys::operator=(TrafficKeys&& other) noexcept {
  if (this == &other) return *this;
  wipe();
  suite = other.suite;
  secret = std::move(other.secret);
  key = std::move(other.key);
  iv = other.iv;
  return *this;
}

TrafficKeys::~TrafficKeys() { wipe(); }

TrafficKeys traffic_keys(CipherSuite suite, std::vector<unsigned char> secret) {
  TrafficKeys keys;
  keys.suite = suite;
  keys.key = expand_label(suite, secret, "key", suite == CipherSuite::Aes128Gcm ? 16 : 32);
  const std::vector<unsigned char> iv = expand_label(suite, secret, "iv", kAeadNonceBytes);
  std::copy(iv.begin(), iv.end(), keys.iv.begin());
  keys.secret = std::move(secret);
  return keys;
}

TrafficKeys next_generation(const TrafficKeys& keys) {
  return traffic_keys(keys.suite, expand_label(keys.suite, keys.secret, "traffic upd", keys.secret.size()));
}

void keep_traffic_secrets(SSL_CTX* context) { SSL_CTX_set_keylog_callback(context, &note_secret); }

void keep_traffic_secrets(SSL* ssl) {
  auto secrets = std::make_unique<Secrets>();
  if (secrets_slot() < 0 || SSL_set_ex_data(ssl, secrets_slot(), secrets.get()) != 1)
    throw IoError("OpenSSL has no slot for a connection's TLS secrets");
  secrets.release();  // free_secrets() deletes it with the connection
}

ConnectionKeys connection_keys(SSL* ssl) {
  auto* secrets = static_cast<Secrets*>(SSL_get_ex_data(ssl, secrets_slot()));
  if (secrets == nullptr || secrets->client.empty() || secrets->server.empty())
    throw ProtocolError("the TLS handshake ended without OpenSSL giving the traffic secrets");
  const SSL_CIPHER* cipher = SSL_get_current_cipher(ssl);
  CipherSuite suite;
  switch (cipher == nullptr ? 0 : SSL_CIPHER_get_protocol_id(cipher)) {
    case 0x1301: suite = CipherSuite::Aes128Gcm; break;
    case 0x1302: suite = CipherSuite::Aes256Gcm; break;
    case 0x1303: suite = CipherSuite::ChaCha20Poly1305; break;
    default: throw ProtocolError("the TLS handshake chose a cipher suite other than TLS 1.3's AES-GCM and ChaCha20-Poly1305");
  }
  const bool server = SSL_is_server(ssl) == 1;
  ConnectionKeys keys{traffic_keys(suite, server ? secrets->server : secrets->client),
                      traffic_keys(suite, server ? secrets->client : secrets->server)};
  return keys;
}

}  // namespace cohort::comm::tcp
