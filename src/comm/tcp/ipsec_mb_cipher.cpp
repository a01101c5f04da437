// AES-GCM of TLS records through Intel's ipsec-mb, on the instruction set chosen: its managers are made
// once, one per set the processor has, and only their GCM functions are called (no job queue), which
// touches no state of the manager, so threads share them.
#include <intel-ipsec-mb.h>
#include <openssl/crypto.h>

#include <array>
#include <cstring>

#include "cohort/core/error.hpp"
#include "record_cipher.hpp"

namespace cohort::comm::tcp::ipsec_mb {
namespace {

constexpr std::array kEngines = {RecordEngine::IpsecMbSse, RecordEngine::IpsecMbAvx, RecordEngine::IpsecMbAvx2,
                                 RecordEngine::IpsecMbAvx512};

std::size_t index_of(RecordEngine engine) {
  for (std::size_t i = 0; i < kEngines.size(); ++i)
    if (kEngines[i] == engine) return i;
  throw InvalidArgument("not an ipsec-mb engine");
}

struct Managers {
  std::array<IMB_MGR*, kEngines.size()> by_engine{};  // null where the processor lacks the instructions
  bool vaes = false;

  Managers() {
    constexpr std::array<std::uint64_t, kEngines.size()> needs = {IMB_CPUFLAGS_SSE, IMB_CPUFLAGS_AVX, IMB_CPUFLAGS_AVX2,
                                                                 IMB_CPUFLAGS_AVX512};
    constexpr std::array<void (*)(IMB_MGR*), kEngines.size()> init = {init_mb_mgr_sse, init_mb_mgr_avx, init_mb_mgr_avx2,
                                                                      init_mb_mgr_avx512};
    const std::uint64_t has = imb_get_feature_flags();
    vaes = (has & (IMB_FEATURE_VAES | IMB_FEATURE_VPCLMULQDQ)) == (IMB_FEATURE_VAES | IMB_FEATURE_VPCLMULQDQ);
    for (std::size_t i = 0; i < kEngines.size(); ++i) {
      if ((has & needs[i]) != needs[i]) continue;
      IMB_MGR* manager = alloc_mb_mgr(0);
      if (manager == nullptr) continue;
      init[i](manager);
      if (imb_get_errno(manager) == 0) by_engine[i] = manager;
      else free_mb_mgr(manager);
    }
  }
};

// Never freed: a connection's I/O thread may still seal or open records while static objects are destroyed.
const Managers& managers() {
  static const Managers* const made = new Managers;
  return *made;
}

// The key schedule and hash-key powers, aligned as ipsec-mb's vector code expects.
struct alignas(64) AlignedKey {
  gcm_key_data data;
};

template <bool kAes128>
class IpsecMbCipher final : public RecordCipher {
 public:
  IpsecMbCipher(IMB_MGR* manager, std::span<const unsigned char> key) : manager_(manager) {
    if (key.size() != (kAes128 ? 16u : 32u)) throw InvalidArgument("a TLS record key of the wrong length");
    if constexpr (kAes128) IMB_AES128_GCM_PRE(manager_, key.data(), &key_.data);
    else IMB_AES256_GCM_PRE(manager_, key.data(), &key_.data);
  }
  ~IpsecMbCipher() override { OPENSSL_cleanse(&key_, sizeof key_); }

  void seal(const AeadNonce& nonce, std::span<const unsigned char> aad, std::span<const unsigned char> body, unsigned char type,
            unsigned char* out, unsigned char* tag) override {
    gcm_context_data context;
    if constexpr (kAes128) {
      IMB_AES128_GCM_INIT(manager_, &key_.data, &context, nonce.data(), aad.data(), aad.size());
      IMB_AES128_GCM_ENC_UPDATE(manager_, &key_.data, &context, out, body.data(), body.size());
      IMB_AES128_GCM_ENC_UPDATE(manager_, &key_.data, &context, out + body.size(), &type, 1);
      IMB_AES128_GCM_ENC_FINALIZE(manager_, &key_.data, &context, tag, kAeadTagBytes);
    } else {
      IMB_AES256_GCM_INIT(manager_, &key_.data, &context, nonce.data(), aad.data(), aad.size());
      IMB_AES256_GCM_ENC_UPDATE(manager_, &key_.data, &context, out, body.data(), body.size());
      IMB_AES256_GCM_ENC_UPDATE(manager_, &key_.data, &context, out + body.size(), &type, 1);
      IMB_AES256_GCM_ENC_FINALIZE(manager_, &key_.data, &context, tag, kAeadTagBytes);
    }
  }

  bool open(const AeadNonce& nonce, std::span<const unsigned char> aad, std::span<const unsigned char> ciphertext,
            std::span<unsigned char> head, std::span<unsigned char> tail, const unsigned char* tag) override {
    gcm_context_data context;
    unsigned char computed[kAeadTagBytes];
    const unsigned char* rest = ciphertext.data() + head.size();
    if constexpr (kAes128) {
      IMB_AES128_GCM_INIT(manager_, &key_.data, &context, nonce.data(), aad.data(), aad.size());
      IMB_AES128_GCM_DEC_UPDATE(manager_, &key_.data, &context, head.data(), ciphertext.data(), head.size());
      IMB_AES128_GCM_DEC_UPDATE(manager_, &key_.data, &context, tail.data(), rest, tail.size());
      IMB_AES128_GCM_DEC_FINALIZE(manager_, &key_.data, &context, computed, kAeadTagBytes);
    } else {
      IMB_AES256_GCM_INIT(manager_, &key_.data, &context, nonce.data(), aad.data(), aad.size());
      IMB_AES256_GCM_DEC_UPDATE(manager_, &key_.data, &context, head.data(), ciphertext.data(), head.size());
      IMB_AES256_GCM_DEC_UPDATE(manager_, &key_.data, &context, tail.data(), rest, tail.size());
      IMB_AES256_GCM_DEC_FINALIZE(manager_, &key_.data, &context, computed, kAeadTagBytes);
    }
    return CRYPTO_memcmp(computed, tag, kAeadTagBytes) == 0;
  }

 private:
  IMB_MGR* manager_;
  AlignedKey key_;
};

}  // namespace

std::vector<RecordEngine> engines() {
  std::vector<RecordEngine> found;
  for (std::size_t i = 0; i < kEngines.size(); ++i)
    if (managers().by_engine[i] != nullptr) found.push_back(kEngines[i]);
  return found;
}

std::string describe(RecordEngine engine) {
  constexpr std::array<const char*, kEngines.size()> names = {"SSE", "AVX", "AVX2", "AVX-512"};
  const bool vaes = engine == RecordEngine::IpsecMbAvx512 && managers().vaes;
  return std::string("Intel ipsec-mb ") + IMB_VERSION_STR + " (" + names[index_of(engine)] + (vaes ? ", VAES" : "") + ")";
}

std::unique_ptr<RecordCipher> make(RecordEngine engine, CipherSuite suite, std::span<const unsigned char> key) {
  IMB_MGR* manager = managers().by_engine[index_of(engine)];
  if (manager == nullptr) throw InvalidArgument("this processor lacks the instructions of " + ipsec_mb::describe(engine));
  if (suite == CipherSuite::Aes128Gcm) return std::make_unique<IpsecMbCipher<true>>(manager, key);
  return std::make_unique<IpsecMbCipher<false>>(manager, key);
}

}  // namespace cohort::comm::tcp::ipsec_mb
