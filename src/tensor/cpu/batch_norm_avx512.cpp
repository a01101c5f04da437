// AVX-512 passes of batch normalization (see avx512_passes.hpp). The sums run over the rows with up to
// eight 16-channel chunks' accumulators in registers at once; the elementwise passes take a row's chunks in
// turn.
#include "avx512_passes.hpp"

#include "avx512_lanes.hpp"

namespace cohort::cpu::avx512 {
namespace {

constexpr std::int64_t kMaxChunks = 8;  // 2 x 8 accumulators of the 32 registers

// The gradient reaching the normalized values at element i of channel c: dy, masked where the recomputed ReLU
// output is not positive (multiplier and offset are read only then: without ReLU they may be null).
template <class T>
__m512 normalized_gradient(const T* x, const T* dy, const float* multiplier, const float* offset, bool relu,
                           std::int64_t i, std::int64_t c) {
  const __m512 gradient = load(dy + i);
  if (!relu) return gradient;
  const __m512 pre = _mm512_fmadd_ps(load(x + i), load(multiplier + c), load(offset + c));
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(pre, _mm512_setzero_ps(), _CMP_GT_OQ), gradient);
}

// Runs sums over `chunks` consecutive 16-channel chunks from c0, accumulating first(row, c) and second(row, c)
// for every row into first_out/second_out.
template <std::int64_t Chunks, class Terms>
void chunk_sums(std::int64_t rows, std::int64_t c0, Terms&& terms, float* first_out, float* second_out) {
  __m512 first[Chunks], second[Chunks];
#pragma GCC unroll 8
  for (std::int64_t k = 0; k < Chunks; ++k) first[k] = second[k] = _mm512_setzero_ps();
  for (std::int64_t m = 0; m < rows; ++m) {
#pragma GCC unroll 8
    for (std::int64_t k = 0; k < Chunks; ++k) terms(m, c0 + k * kLanes, first[k], second[k]);
  }
#pragma GCC unroll 8
  for (std::int64_t k = 0; k < Chunks; ++k) {
    _mm512_storeu_ps(first_out + c0 + k * kLanes, first[k]);
    _mm512_storeu_ps(second_out + c0 + k * kLanes, second[k]);
  }
}

// chunk_sums over the whole width, at most kMaxChunks chunks at a time.
template <class Terms>
void channel_sums(std::int64_t rows, std::int64_t width, Terms&& terms, float* first_out, float* second_out) {
  for (std::int64_t c0 = 0; c0 < width; c0 += kMaxChunks * kLanes) {
    const std::int64_t chunks = (width - c0) / kLanes < kMaxChunks ? (width - c0) / kLanes : kMaxChunks;
    switch (chunks) {
      case 1: chunk_sums<1>(rows, c0, terms, first_out, second_out); break;
      case 2: chunk_sums<2>(rows, c0, terms, first_out, second_out); break;
      case 3: chunk_sums<3>(rows, c0, terms, first_out, second_out); break;
      case 4: chunk_sums<4>(rows, c0, terms, first_out, second_out); break;
      case 5: chunk_sums<5>(rows, c0, terms, first_out, second_out); break;
      case 6: chunk_sums<6>(rows, c0, terms, first_out, second_out); break;
      case 7: chunk_sums<7>(rows, c0, terms, first_out, second_out); break;
      default: chunk_sums<kMaxChunks>(rows, c0, terms, first_out, second_out); break;
    }
  }
}

}  // namespace

template <class T>
void moments(const T* x, const float* shift, std::int64_t rows, std::int64_t width, float* sum, float* squares) {
  channel_sums(
      rows, width,
      [&](std::int64_t m, std::int64_t c, __m512& s, __m512& q) {
        const __m512 d = _mm512_sub_ps(load(x + m * width + c), load(shift + c));
        s = _mm512_add_ps(s, d);
        q = _mm512_fmadd_ps(d, d, q);
      },
      sum, squares);
}

template <class T>
void normalize(const T* x, const float* multiplier, const float* offset, bool relu, std::int64_t rows,
               std::int64_t width, T* y) {
  const __m512 floor = relu ? _mm512_setzero_ps() : _mm512_set1_ps(-__builtin_inff());
  for (std::int64_t m = 0; m < rows; ++m)
    for (std::int64_t c = 0; c < width; c += kLanes) {
      const std::int64_t i = m * width + c;
      const __m512 v = _mm512_fmadd_ps(load(x + i), load(multiplier + c), load(offset + c));
      // max(v, 0) as relu(v) = v > 0 ? v : 0: NaN becomes 0 in both; max with -inf keeps v.
      store(y + i, relu ? _mm512_max_ps(v, floor) : v);
    }
}

template <class T>
void gradient_moments(const T* x, const T* dy, const float* multiplier, const float* offset, bool relu,
                      const float* mean, const float* inv_std, std::int64_t rows, std::int64_t width,
                      float* grad_sum, float* grad_dot_xhat) {
  channel_sums(
      rows, width,
      [&](std::int64_t m, std::int64_t c, __m512& s, __m512& dot) {
        const std::int64_t i = m * width + c;
        const __m512 g = normalized_gradient(x, dy, multiplier, offset, relu, i, c);
        const __m512 xhat = _mm512_mul_ps(_mm512_sub_ps(load(x + i), load(mean + c)), load(inv_std + c));
        s = _mm512_add_ps(s, g);
        dot = _mm512_fmadd_ps(g, xhat, dot);
      },
      grad_sum, grad_dot_xhat);
}

template <class T>
void data_gradient(const T* x, const T* dy, const float* multiplier, const float* offset, bool relu,
                   const float* a, const float* b, const float* s, const float* mean, std::int64_t rows,
                   std::int64_t width, T* dx) {
  for (std::int64_t m = 0; m < rows; ++m)
    for (std::int64_t c = 0; c < width; c += kLanes) {
      const std::int64_t i = m * width + c;
      const __m512 g = normalized_gradient(x, dy, multiplier, offset, relu, i, c);
      const __m512 centred = _mm512_sub_ps(load(x + i), load(mean + c));
      const __m512 inner = _mm512_fnmadd_ps(centred, load(s + c), _mm512_sub_ps(g, load(b + c)));
      store(dx + i, _mm512_mul_ps(load(a + c), inner));
    }
}

#define COHORT_BATCH_NORM_AVX512(T)                                                                                  \
  template void moments<T>(const T*, const float*, std::int64_t, std::int64_t, float*, float*);                     \
  template void normalize<T>(const T*, const float*, const float*, bool, std::int64_t, std::int64_t, T*);           \
  template void gradient_moments<T>(const T*, const T*, const float*, const float*, bool, const float*, const float*, \
                                    std::int64_t, std::int64_t, float*, float*);                                    \
  template void data_gradient<T>(const T*, const T*, const float*, const float*, bool, const float*, const float*,   \
                                 const float*, const float*, std::int64_t, std::int64_t, T*);
COHORT_BATCH_NORM_AVX512(float)
COHORT_BATCH_NORM_AVX512(std::uint16_t)
#undef COHORT_BATCH_NORM_AVX512

}  // namespace cohort::cpu::avx512
