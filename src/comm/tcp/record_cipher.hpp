#pragma once
// The AEAD of a TLS 1.3 cipher suite, sealing and opening one record at a time. Two engines do the work:
// OpenSSL's EVP, and Intel's ipsec-mb for AES-GCM where the build found it, whose VAES/AVX-512 code runs
// 2.6-2.8x OpenSSL 3.0's AES-GCM on one core (16 KiB records, benchmarks/tls_records_bench.cpp): 16.7
// against 6.0 GB/s on a Xeon (Sapphire Rapids), 10.6 against 4.1 GB/s on an EPYC (Zen 4).
#include <array>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace cohort::comm::tcp {

enum class CipherSuite { Aes128Gcm, Aes256Gcm, ChaCha20Poly1305 };

// OpenSSL, or ipsec-mb compiled for one instruction set (tests force each that the processor has).
enum class RecordEngine { OpenSsl, IpsecMbSse, IpsecMbAvx, IpsecMbAvx2, IpsecMbAvx512 };

constexpr std::size_t kAeadTagBytes = 16;
constexpr std::size_t kAeadNonceBytes = 12;
using AeadNonce = std::array<unsigned char, kAeadNonceBytes>;

class RecordCipher {
 public:
  virtual ~RecordCipher() = default;
  // Encrypts `body`, then the byte `type`, to `out` (body.size() + 1 bytes), and writes the tag to `tag`.
  virtual void seal(const AeadNonce& nonce, std::span<const unsigned char> aad, std::span<const unsigned char> body,
                    unsigned char type, unsigned char* out, unsigned char* tag) = 0;
  // Decrypts `ciphertext` into `head`, then `tail` (their sizes add up to its size). False when `tag` does
  // not authenticate it: what was written then is garbage.
  virtual bool open(const AeadNonce& nonce, std::span<const unsigned char> aad, std::span<const unsigned char> ciphertext,
                    std::span<unsigned char> head, std::span<unsigned char> tail, const unsigned char* tag) = 0;
};

// The engines this build and processor can run, OpenSSL first and the fastest last.
std::vector<RecordEngine> record_engines();
RecordEngine fastest_record_engine();
// "OpenSSL" or "Intel ipsec-mb (AVX-512, VAES)", for the log.
std::string describe(RecordEngine engine);

// The suite's cipher under `key` (16 bytes for AES-128, 32 otherwise) on `engine`; ChaCha20-Poly1305 is
// OpenSSL's whatever the engine. Throws InvalidArgument for an engine this build or processor lacks.
std::unique_ptr<RecordCipher> make_record_cipher(RecordEngine engine, CipherSuite suite, std::span<const unsigned char> key);

// ipsec-mb's side, built from ipsec_mb_cipher.cpp or, without the library, ipsec_mb_missing.cpp.
namespace ipsec_mb {
std::vector<RecordEngine> engines();
std::string describe(RecordEngine engine);
std::unique_ptr<RecordCipher> make(RecordEngine engine, CipherSuite suite, std::span<const unsigned char> key);
}  // namespace ipsec_mb

}  // namespace cohort::comm::tcp
