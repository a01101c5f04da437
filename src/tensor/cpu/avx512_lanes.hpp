#pragma once
// Sixteen float32 lanes loaded from and stored to float32 or bfloat16 operands (the bits, std::uint16_t), for
// the translation units compiled for AVX-512 alone (batch_norm_avx512.cpp, max_pool_avx512.cpp). bfloat16
// widens by a shift and rounds to nearest even in integer arithmetic, NaN kept quiet, as to_bfloat16_bits does
// (vcvtneps2bf16 would flush subnormals).
#include <immintrin.h>

#include <cstdint>

#include "avx512_passes.hpp"

namespace cohort::cpu::avx512 {

inline __m512 load(const float* p) { return _mm512_loadu_ps(p); }

inline __m512 load(const std::uint16_t* p) {
  const __m512i widened = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(widened, 16));
}

inline void store(float* p, __m512 v) { _mm512_storeu_ps(p, v); }

inline void store(std::uint16_t* p, __m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  rounded = _mm512_mask_or_epi32(rounded, nan, bits, _mm512_set1_epi32(0x00400000));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
}

}  // namespace cohort::cpu::avx512
