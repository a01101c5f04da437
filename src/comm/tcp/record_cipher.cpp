#include "record_cipher.hpp"

#include <openssl/evp.h>

#include "cohort/core/error.hpp"

namespace cohort::comm::tcp {
namespace {

class OpenSslCipher final : public RecordCipher {
 public:
  OpenSslCipher(CipherSuite suite, std::span<const unsigned char> key) {
    const EVP_CIPHER* cipher = suite == CipherSuite::Aes128Gcm   ? EVP_aes_128_gcm()
                               : suite == CipherSuite::Aes256Gcm ? EVP_aes_256_gcm()
                                                                 : EVP_chacha20_poly1305();
    if (static_cast<std::size_t>(EVP_CIPHER_get_key_length(cipher)) != key.size())
      throw InvalidArgument("a TLS record key of the wrong length");
    for (auto* context : {&sealing_, &opening_}) {
      context->reset(EVP_CIPHER_CTX_new());
      if (!*context) throw IoError("OpenSSL cannot make a cipher context");
    }
    if (EVP_EncryptInit_ex(sealing_.get(), cipher, nullptr, key.data(), nullptr) != 1 ||
        EVP_DecryptInit_ex(opening_.get(), cipher, nullptr, key.data(), nullptr) != 1)
      throw IoError("OpenSSL cannot key the TLS record cipher");
  }

  void seal(const AeadNonce& nonce, std::span<const unsigned char> aad, std::span<const unsigned char> body, unsigned char type,
            unsigned char* out, unsigned char* tag) override {
    EVP_CIPHER_CTX* context = sealing_.get();
    int written = 0;
    const bool sealed = EVP_EncryptInit_ex(context, nullptr, nullptr, nullptr, nonce.data()) == 1 &&
                        EVP_EncryptUpdate(context, nullptr, &written, aad.data(), static_cast<int>(aad.size())) == 1 &&
                        EVP_EncryptUpdate(context, out, &written, body.data(), static_cast<int>(body.size())) == 1 &&
                        EVP_EncryptUpdate(context, out + body.size(), &written, &type, 1) == 1 &&
                        EVP_EncryptFinal_ex(context, out + body.size() + 1, &written) == 1 &&
                        EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_AEAD_GET_TAG, kAeadTagBytes, tag) == 1;
    if (!sealed) throw IoError("OpenSSL failed to encrypt a TLS record");
  }

  bool open(const AeadNonce& nonce, std::span<const unsigned char> aad, std::span<const unsigned char> ciphertext,
            std::span<unsigned char> head, std::span<unsigned char> tail, const unsigned char* tag) override {
    EVP_CIPHER_CTX* context = opening_.get();
    int written = 0;
    unsigned char expected[kAeadTagBytes];
    std::copy(tag, tag + kAeadTagBytes, expected);
    return EVP_DecryptInit_ex(context, nullptr, nullptr, nullptr, nonce.data()) == 1 &&
           EVP_DecryptUpdate(context, nullptr, &written, aad.data(), static_cast<int>(aad.size())) == 1 &&
           EVP_DecryptUpdate(context, head.data(), &written, ciphertext.data(), static_cast<int>(head.size())) == 1 &&
           EVP_DecryptUpdate(context, tail.data(), &written, ciphertext.data() + head.size(), static_cast<int>(tail.size())) == 1 &&
           EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_AEAD_SET_TAG, kAeadTagBytes, expected) == 1 &&
           EVP_DecryptFinal_ex(context, tail.data() + tail.size(), &written) == 1;
  }

 private:
  struct FreeContext {
    void operator()(EVP_CIPHER_CTX* context) const { EVP_CIPHER_CTX_free(context); }
  };
  std::unique_ptr<EVP_CIPHER_CTX, FreeContext> sealing_, opening_;
};

}  // namespace

std::vector<RecordEngine> record_engines() {
  std::vector<RecordEngine> engines{RecordEngine::OpenSsl};
  for (const RecordEngine engine : ipsec_mb::engines()) engines.push_back(engine);
  return engines;
}

RecordEngine fastest_record_engine() { return record_engines().back(); }

std::string describe(RecordEngine engine) { return engine == RecordEngine::OpenSsl ? "OpenSSL" : ipsec_mb::describe(engine); }

std::unique_ptr<RecordCipher> make_record_cipher(RecordEngine engine, CipherSuite suite, std::span<const unsigned char> key) {
  if (engine == RecordEngine::OpenSsl || suite == CipherSuite::ChaCha20Poly1305) return std::make_unique<OpenSslCipher>(suite, key);
  return ipsec_mb::make(engine, suite, key);
}

}  // namespace cohort::comm::tcp
