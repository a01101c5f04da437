#pragma once
// The TLS 1.3 settings every connection of one transport shares: keyed from the shared secret (PSK), or
// mutual certificates checked against a CA. Session tickets are off: connections live as long as the job.
// OpenSSL runs the handshakes; the records after them are sealed by the fastest engine this build and
// processor have (record_cipher.hpp).
#include <asio/ssl.hpp>

#include "cohort/comm/tcp.hpp"
#include "handshake.hpp"
#include "record_cipher.hpp"

namespace cohort::comm::tcp {

class TlsContext {
 public:
  // Throws InvalidArgument naming a certificate, key or CA file that cannot be used.
  TlsContext(const TlsOptions& options, const std::string& secret);
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  asio::ssl::context& context() { return context_; }
  RecordEngine record_engine() const { return record_engine_; }
  // "TLS 1.3, keyed from the shared secret; records sealed by OpenSSL", or with certificates, for the log.
  const std::string& description() const { return description_; }

 private:
  static unsigned int client_key(SSL* ssl, const char* hint, char* identity, unsigned int max_identity,
                                 unsigned char* key, unsigned int max_key);
  static unsigned int server_key(SSL* ssl, const char* identity, unsigned char* key, unsigned int max_key);

  asio::ssl::context context_{asio::ssl::context::tls};
  Mac key_{};
  RecordEngine record_engine_ = fastest_record_engine();
  std::string description_;
};

}  // namespace cohort::comm::tcp
