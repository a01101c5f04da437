#pragma once
// Passes over NHWC activations written with AVX-512 for channel counts that are multiples of 16, with
// float32 or bfloat16 operands (T = float or the bfloat16 bits, std::uint16_t): batch normalization's
// (batch_norm_avx512.cpp) and 2x2 max pooling's (max_pool_avx512.cpp), compiled for AVX-512 alone. They keep
// a row's sums in registers and convert bfloat16 sixteen lanes at a time, which the compiler's vectorization of
// the portable loops (batch_norm.cpp, pooling.cpp) does not; those run them where the AVX-512 kernels were
// chosen (winograd_isa()). Both element types take the same arithmetic, so a bfloat16 pass gives the bits of
// the float32 pass on the widened operands, rounded once.
#include <cstdint>

namespace cohort::cpu::avx512 {

constexpr std::int64_t kLanes = 16;

// Whether the passes run for this many channels: the AVX-512 kernels were chosen (winograd_isa()), and the
// channels fill the lanes. Defined with that choice in winograd.cpp, outside the translation units compiled
// for AVX-512.
bool run_for(std::int64_t channels);

// ---- batch normalization over rows of an (M x C) view

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

// ---- max pooling over 2x2 windows at stride 2, one sample of in_h x in_w x c, out_h and out_w windows
// (uncovered rows and columns, where in_h or in_w is odd, are the caller's)

// y = the maximum of each window, NaN skipped as `m = m < v ? v : m` from -infinity skips it.
template <class T>
void max_pool_2x2_forward(const T* x, std::int64_t in_w, std::int64_t c, std::int64_t out_h, std::int64_t out_w, T* y);

// dx = dy at each window's first pixel equal to its maximum y (in row order), +0 at the others.
template <class T>
void max_pool_2x2_backward(const T* x, const T* y, const T* dy, std::int64_t in_w, std::int64_t c, std::int64_t out_h,
                           std::int64_t out_w, T* dx);

}  // namespace cohort::cpu::avx512
