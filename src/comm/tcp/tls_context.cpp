#include "tls_context.hpp"

#include <fmt/format.h>
#include <openssl/ssl.h>

#include <cstring>

#include "cohort/core/error.hpp"
#include "tls_keys.hpp"

namespace cohort::comm::tcp {
namespace {

constexpr char kIdentity[] = "cohort";

// Where a context keeps its key for the callbacks: a slot of its own (Asio keeps its callbacks in app data).
int key_slot() {
  static const int slot = SSL_CTX_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return slot;
}

const Mac* key_of(SSL* ssl) { return static_cast<const Mac*>(SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), key_slot())); }

}  // namespace

TlsContext::TlsContext(const TlsOptions& options, const std::string& secret) {
  SSL_CTX* native = context_.native_handle();
  SSL_CTX_set_min_proto_version(native, TLS1_3_VERSION);
  SSL_CTX_set_options(native, SSL_OP_NO_TICKET);
  SSL_CTX_set_num_tickets(native, 0);
  // AES-128-GCM first (OpenSSL's own order starts with AES-256): TLS 1.3's mandatory suite, and measured
  // 1.2-1.5x the bandwidth of AES-256-GCM from 64 KiB on (benchmarks/allreduce_compare.sh, TLS column).
  SSL_CTX_set_ciphersuites(native, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256");
  keep_traffic_secrets(native);
  const std::string records = "; records sealed by " + describe(record_engine_);
  const bool certificates = !options.certificate.empty() || !options.private_key.empty() || !options.ca.empty();
  if (!certificates) {
    key_ = tls_key(secret);
    if (key_slot() < 0 || SSL_CTX_set_ex_data(native, key_slot(), &key_) != 1) throw IoError("OpenSSL has no slot for the TLS key");
    SSL_CTX_set_psk_client_callback(native, &TlsContext::client_key);
    SSL_CTX_set_psk_server_callback(native, &TlsContext::server_key);
    description_ = "TLS 1.3, keyed from the shared secret" + records;
    return;
  }
  if (options.certificate.empty() || options.private_key.empty() || options.ca.empty())
    throw InvalidArgument("TLS with certificates needs a certificate, its private key and a CA, all three");
  auto use = [](const std::string& what, const std::string& path, auto&& load) {
    asio::error_code error;
    load(error);
    if (error) throw InvalidArgument(fmt::format("TLS {} {}: cannot be used: {}", what, path, error.message()));
  };
  use("certificate", options.certificate, [&](asio::error_code& e) { context_.use_certificate_chain_file(options.certificate, e); });
  use("private key", options.private_key,
      [&](asio::error_code& e) { context_.use_private_key_file(options.private_key, asio::ssl::context::pem, e); });
  use("CA", options.ca, [&](asio::error_code& e) { context_.load_verify_file(options.ca, e); });
  context_.set_verify_mode(asio::ssl::verify_peer | asio::ssl::verify_fail_if_no_peer_cert);
  description_ = fmt::format("TLS 1.3, certificates checked against {}{}", options.ca, records);
}

unsigned int TlsContext::client_key(SSL* ssl, const char*, char* identity, unsigned int max_identity, unsigned char* key,
                                    unsigned int max_key) {
  const Mac* psk = key_of(ssl);
  if (psk == nullptr || max_identity < sizeof kIdentity || max_key < psk->size()) return 0;
  std::memcpy(identity, kIdentity, sizeof kIdentity);
  std::memcpy(key, psk->data(), psk->size());
  return static_cast<unsigned int>(psk->size());
}

unsigned int TlsContext::server_key(SSL* ssl, const char* identity, unsigned char* key, unsigned int max_key) {
  const Mac* psk = key_of(ssl);
  if (psk == nullptr || identity == nullptr || std::strcmp(identity, kIdentity) != 0 || max_key < psk->size()) return 0;
  std::memcpy(key, psk->data(), psk->size());
  return static_cast<unsigned int>(psk->size());
}

}  // namespace cohort::comm::tcp
