// A build without Intel's ipsec-mb (libipsec-mb-dev): OpenSSL protects every TLS record.
#include "cohort/core/error.hpp"
#include "record_cipher.hpp"

namespace cohort::comm::tcp::ipsec_mb {

std::vector<RecordEngine> engines() { return {}; }

std::string describe(RecordEngine) { return "Intel ipsec-mb, which this build lacks (libipsec-mb-dev)"; }

std::unique_ptr<RecordCipher> make(RecordEngine engine, CipherSuite, std::span<const unsigned char>) {
  throw InvalidArgument("TLS records cannot use " + ipsec_mb::describe(engine));
}

}  // namespace cohort::comm::tcp::ipsec_mb
