#pragma once
// Batch normalization's passes over rows of an (M x C) view written with AVX-512 (batch_norm_avx512.cpp,
// compiled for AVX-512 alone), for C a multiple of 16 and float32 or bfloat16 operands (T = float or the
// bfloat16 bits, std::uint16_t). They keep every channel's sums in registers and convert bfloat16 sixteen
// lanes at a time, which the compiler's own vectorization of batch_norm.cpp's loops does not; batch_norm.cpp
// runs them where the AVX-512 kernels were chosen (winograd_isa()) and the activation is Linear or ReLU, and
// its portable loops elsewhere. Both element types take the same arithmetic, so a bfloat16 pass gives the bits
// of the float32 pass on the widened operands, rounded once.
#include <cstdint>

namespace cohort::cpu::avx512 {

constexpr std::int64_t kLanes = 16;

// sum[c] = sum over the rows of (x - shift[c]), squares[c] = sum of its squares (both overwritten).
template <class T>
void moments(const T* x, const float* shift, std::int64_t rows, std::int64_t width, float* sum, float* squares);

// y = activation(x * multiplier[c] + offset[c]), the activation ReLU when `relu`, else none.
template <class T>
void normalize(const T* x, const float* multiplier, const float* offset, bool relu, std::int64_t rows,
               std::int64_t width, T* y);

// With g = dy, or dy where x * multiplier + offset > 0 when `relu` (the forward's ReLU recomputed from x):
// grad_sum[c] = sum of g, grad_dot_xhat[c] = sum of g * (x - mean[c]) * inv_std[c] (both overwritten).
template <class T>
void gradient_moments(const T* x, const T* dy, const float* multiplier, const float* offset, bool relu,
                      const float* mean, const float* inv_std, std::int64_t rows, std::int64_t width,
                      float* grad_sum, float* grad_dot_xhat);

// dx = a[c] * (g - b[c] - (x - mean[c]) * s[c]), g as above.
template <class T>
void data_gradient(const T* x, const T* dy, const float* multiplier, const float* offset, bool relu,
                   const float* a, const float* b, const float* s, const float* mean, std::int64_t rows,
                   std::int64_t width, T* dx);

}  // namespace cohort::cpu::avx512
