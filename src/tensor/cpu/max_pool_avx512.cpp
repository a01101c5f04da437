// AVX-512 passes of 2x2 max pooling (see avx512_passes.hpp): each window's four pixels sixteen channels at a
// time, with the portable loops' semantics (pooling.cpp): maxima as `m = m < v ? v : m` (vmaxps(v, m) keeps
// m where v is NaN or equal), the gradient to the first pixel equal to the maximum, and 0 + gradient, so that
// a -0 gradient arrives as +0 as the portable loops add it.
#include "avx512_passes.hpp"

#include "avx512_lanes.hpp"

namespace cohort::cpu::avx512 {

template <class T>
void max_pool_2x2_forward(const T* x, std::int64_t in_w, std::int64_t c, std::int64_t out_h, std::int64_t out_w, T* y) {
  const std::int64_t below = in_w * c;
  for (std::int64_t oh = 0; oh < out_h; ++oh)
    for (std::int64_t ow = 0; ow < out_w; ++ow) {
      const T* v = x + (2 * oh * in_w + 2 * ow) * c;
      T* out = y + (oh * out_w + ow) * c;
      for (std::int64_t i = 0; i < c; i += kLanes) {
        __m512 m = _mm512_set1_ps(-__builtin_inff());
        m = _mm512_max_ps(load(v + i), m);
        m = _mm512_max_ps(load(v + c + i), m);
        m = _mm512_max_ps(load(v + below + i), m);
        m = _mm512_max_ps(load(v + below + c + i), m);
        store(out + i, m);
      }
    }
}

template <class T>
void max_pool_2x2_backward(const T* x, const T* y, const T* dy, std::int64_t in_w, std::int64_t c, std::int64_t out_h,
                           std::int64_t out_w, T* dx) {
  const std::int64_t below = in_w * c;
  const __m512 zero = _mm512_setzero_ps();
  for (std::int64_t oh = 0; oh < out_h; ++oh)
    for (std::int64_t ow = 0; ow < out_w; ++ow) {
      const std::int64_t v = (2 * oh * in_w + 2 * ow) * c, o = (oh * out_w + ow) * c;
      for (std::int64_t i = 0; i < c; i += kLanes) {
        const __m512 maximum = load(y + o + i);
        const __m512 gradient = _mm512_add_ps(zero, load(dy + o + i));
        const __mmask16 a = _mm512_cmp_ps_mask(load(x + v + i), maximum, _CMP_EQ_OQ);
        const __mmask16 b = _mm512_kandn(a, _mm512_cmp_ps_mask(load(x + v + c + i), maximum, _CMP_EQ_OQ));
        const __mmask16 ab = _mm512_kor(a, b);
        const __mmask16 d = _mm512_kandn(ab, _mm512_cmp_ps_mask(load(x + v + below + i), maximum, _CMP_EQ_OQ));
        const __mmask16 e =
            _mm512_kandn(_mm512_kor(ab, d), _mm512_cmp_ps_mask(load(x + v + below + c + i), maximum, _CMP_EQ_OQ));
        store(dx + v + i, _mm512_maskz_mov_ps(a, gradient));
        store(dx + v + c + i, _mm512_maskz_mov_ps(b, gradient));
        store(dx + v + below + i, _mm512_maskz_mov_ps(d, gradient));
        store(dx + v + below + c + i, _mm512_maskz_mov_ps(e, gradient));
      }
    }
}

#define COHORT_MAX_POOL_AVX512(T)                                                                                    \
  template void max_pool_2x2_forward<T>(const T*, std::int64_t, std::int64_t, std::int64_t, std::int64_t, T*);      \
  template void max_pool_2x2_backward<T>(const T*, const T*, const T*, std::int64_t, std::int64_t, std::int64_t,    \
                                         std::int64_t, T*);
COHORT_MAX_POOL_AVX512(float)
COHORT_MAX_POOL_AVX512(std::uint16_t)
#undef COHORT_MAX_POOL_AVX512

}  // namespace cohort::cpu::avx512
