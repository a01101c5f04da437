// Batch normalization over the channels (last axis) of an (M x C) view of the input. Statistics are summed
// in float over blocks of rows and the blocks' sums in double, so that large batches keep precision; the
// input's moments are taken about a per-channel shift (its first row) so that a large mean does not cancel.
// Where the AVX-512 kernels were chosen, channels come in multiples of 16 and the activation is Linear or ReLU,
// each pass runs batch_norm_avx512.cpp's kernel over the same blocks of rows instead of the loops here.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "activation_dispatch.hpp"
#include "cpu_backend.hpp"
#include "elements.hpp"
#include "tensor/backend_access.hpp"
#if COHORT_WINOGRAD_X86_VARIANTS
#include "avx512_passes.hpp"
#endif

namespace cohort::cpu {
namespace {

constexpr std::int64_t kBlockRows = 64;

// Whether batch_norm_avx512.cpp's passes run for rows of this width under this activation.
bool avx512_passes(std::int64_t width, Activation activation) {
#if COHORT_WINOGRAD_X86_VARIANTS
  return (activation == Activation::Linear || activation == Activation::Relu) && avx512::run_for(width);
#else
  (void)width, (void)activation;
  return false;
#endif
}

// Per-channel sums of two float terms over all rows, computed in parallel and reduced in thread order
// (repeatable for a given thread count): block(begin, end, first, second) writes the float sums of the rows
// [begin, end), at most kBlockRows of them (twice the lanes of double), which are added to the thread's
// double sums.
template <typename BlockSums>
std::pair<std::vector<double>, std::vector<double>> channel_sums(Rows r, BlockSums&& block) {
  const int threads = omp_get_max_threads();
  const auto channels = static_cast<std::size_t>(r.width);
  const std::int64_t blocks = (r.count + kBlockRows - 1) / kBlockRows;
  std::vector<std::vector<double>> partial(static_cast<std::size_t>(threads), std::vector<double>(2 * channels, 0.0));
#pragma omp parallel
  {
    double* mine = partial[static_cast<std::size_t>(omp_get_thread_num())].data();
    std::vector<float> block_sums(2 * channels);
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::int64_t end = b * kBlockRows + kBlockRows < r.count ? b * kBlockRows + kBlockRows : r.count;
      block(b * kBlockRows, end, block_sums.data(), block_sums.data() + channels);
      for (std::size_t c = 0; c < 2 * channels; ++c) mine[c] += block_sums[c];
    }
  }
  std::pair<std::vector<double>, std::vector<double>> sums{std::vector<double>(channels, 0.0), std::vector<double>(channels, 0.0)};
  for (const auto& p : partial)
    for (std::size_t c = 0; c < channels; ++c) {
      sums.first[c] += p[c];
      sums.second[c] += p[channels + c];
    }
  return sums;
}

// The block sums of channel_sums from two float terms, first(m, c) and second(m, c), in portable loops.
template <typename First, typename Second>
auto term_sums(std::int64_t width, First&& first, Second&& second) {
  return [=](std::int64_t begin, std::int64_t end, float* first_sums, float* second_sums) {
    std::fill_n(first_sums, width, 0.0f);
    std::fill_n(second_sums, width, 0.0f);
    for (std::int64_t m = begin; m < end; ++m) {
#pragma omp simd
      for (std::int64_t c = 0; c < width; ++c) {
        first_sums[c] += first(m, c);
        second_sums[c] += second(m, c);
      }
    }
  };
}

// Runs pass(begin, end) over blocks of rows, spread over the threads.
template <typename Pass>
void in_row_blocks(std::int64_t rows, Pass&& pass) {
  const std::int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
#pragma omp parallel for schedule(static)
  for (std::int64_t b = 0; b < blocks; ++b) pass(b * kBlockRows, std::min(b * kBlockRows + kBlockRows, rows));
}

// Normalization as one multiply-add per channel: y = x * multiplier + offset, with multiplier =
// gamma / sqrt(variance + epsilon) and offset = beta - mean * multiplier. The fused backward recomputes the
// forward's values from it, bit for bit, instead of reading them back from memory.
struct ChannelAffine {
  std::vector<float> multiplier, offset;
};

ChannelAffine channel_affine(std::int64_t channels, const float* mean, const float* variance, const Tensor& gamma,
                             const Tensor& beta, float epsilon) {
  ChannelAffine a{std::vector<float>(static_cast<std::size_t>(channels)), std::vector<float>(static_cast<std::size_t>(channels))};
  for (std::int64_t c = 0; c < channels; ++c) {
    a.multiplier[c] = device_data(gamma)[c] / std::sqrt(variance[c] + epsilon);
    a.offset[c] = device_data(beta)[c] - mean[c] * a.multiplier[c];
  }
  return a;
}

// y = activation(x * multiplier + offset), per channel.
template <class T>
void normalize(const Tensor& x, const ChannelAffine& affine, Activation activation, const Tensor& y) {
  const Rows r = rows_of(x);
  const Elements<T> xp(x), yp(y);
  const float* multiplier = affine.multiplier.data();
  const float* offset = affine.offset.data();
#if COHORT_WINOGRAD_X86_VARIANTS
  if (avx512_passes(r.width, activation)) {
    const T* in = device_elements<T>(x);
    T* out = device_elements<T>(y);
    in_row_blocks(r.count, [&](std::int64_t begin, std::int64_t end) {
      avx512::normalize(in + begin * r.width, multiplier, offset, activation == Activation::Relu, end - begin, r.width,
                        out + begin * r.width);
    });
    return;
  }
#endif
  with_activation(activation, [&](auto activate) {
#pragma omp parallel for
    for (std::int64_t m = 0; m < r.count; ++m) {
#pragma omp simd
      for (std::int64_t c = 0; c < r.width; ++c)
        yp.set(m * r.width + c, activate(xp[m * r.width + c] * multiplier[c] + offset[c]));
    }
  });
}

template <class T>
void forward_training(const BatchNormGeometry& g, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                      Activation activation, const Tensor& y, const Tensor& batch_mean, const Tensor& batch_variance) {
  const Rows r = rows_of(x);
  const Elements<T> xp(x);
  // One pass for both moments of x - shift, shift being the first row: E[d^2] - E[d]^2 then stays accurate
  // whatever the mean.
  std::vector<float> shift_values(static_cast<std::size_t>(r.width));
  for (std::int64_t c = 0; c < r.width; ++c) shift_values[c] = xp[c];
  const float* shift = shift_values.data();
  const auto moments = [&] {
#if COHORT_WINOGRAD_X86_VARIANTS
    if (avx512_passes(r.width, Activation::Linear)) {  // whatever the activation: the unfused ops' statistics
      const T* in = device_elements<T>(x);
      return channel_sums(r, [&](std::int64_t begin, std::int64_t end, float* sums, float* squares) {
        avx512::moments(in + begin * r.width, shift, end - begin, r.width, sums, squares);
      });
    }
#endif
    return channel_sums(r, term_sums(
                               r.width, [=](std::int64_t m, std::int64_t c) { return xp[m * r.width + c] - shift[c]; },
                               [=](std::int64_t m, std::int64_t c) {
                                 const float d = xp[m * r.width + c] - shift[c];
                                 return d * d;
                               }));
  };
  const auto [sums, squares] = moments();
  const double inverse_count = 1.0 / static_cast<double>(r.count);
  for (std::int64_t c = 0; c < r.width; ++c) {
    const double mean_offset = sums[c] * inverse_count;
    device_data(batch_mean)[c] = static_cast<float>(shift[c] + mean_offset);
    device_data(batch_variance)[c] =
        static_cast<float>(std::max(squares[c] * inverse_count - mean_offset * mean_offset, 0.0));
  }
  normalize<T>(x, channel_affine(r.width, device_data(batch_mean), device_data(batch_variance), gamma, beta, g.epsilon),
               activation, y);
}

}  // namespace

void CpuBackend::batch_norm_forward_training(const PlanState* plan, const BatchNormGeometry& g, const Tensor& x,
                                             const Tensor& gamma, const Tensor& beta, const Tensor& y,
                                             const Tensor& batch_mean, const Tensor& batch_variance) {
  batch_norm_activation_forward_training(plan, g, x, gamma, beta, Activation::Linear, y, batch_mean, batch_variance);
}

void CpuBackend::batch_norm_activation_forward_training(const PlanState*, const BatchNormGeometry& g, const Tensor& x,
                                                        const Tensor& gamma, const Tensor& beta, Activation activation,
                                                        const Tensor& y, const Tensor& batch_mean,
                                                        const Tensor& batch_variance) {
  with_stored(x.dtype(), [&](auto stored) {
    forward_training<decltype(stored)>(g, x, gamma, beta, activation, y, batch_mean, batch_variance);
  });
}

void CpuBackend::batch_norm_forward_inference(const PlanState* plan, const BatchNormGeometry& g, const Tensor& x,
                                              const Tensor& gamma, const Tensor& beta, const Tensor& mean,
                                              const Tensor& variance, const Tensor& y) {
  batch_norm_activation_forward_inference(plan, g, x, gamma, beta, mean, variance, Activation::Linear, y);
}

void CpuBackend::batch_norm_activation_forward_inference(const PlanState*, const BatchNormGeometry& g,
                                                         const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                                         const Tensor& mean, const Tensor& variance,
                                                         Activation activation, const Tensor& y) {
  const ChannelAffine affine = channel_affine(rows_of(x).width, device_data(mean), device_data(variance), gamma, beta, g.epsilon);
  with_stored(x.dtype(), [&](auto stored) { normalize<decltype(stored)>(x, affine, activation, y); });
}

namespace {

// What the backward passes share: 1 / sqrt(variance + epsilon), and the parameter gradients
// dbeta = sum(g) and dgamma = sum(g * xhat), kept in double for the data gradient, where g(m, c) is the
// gradient of the normalized values.
struct ParameterGradients {
  std::vector<float> inv_std;
  std::vector<double> grad_sum, grad_dot_xhat;
};

ParameterGradients inverse_std(const Tensor& variance, float epsilon) {
  ParameterGradients p;
  p.inv_std.resize(static_cast<std::size_t>(variance.numel()));
  for (std::int64_t c = 0; c < variance.numel(); ++c) p.inv_std[c] = 1.0f / std::sqrt(device_data(variance)[c] + epsilon);
  return p;
}

// Sums the parameter gradients into p with channel_sums' `block` and writes them to dgamma and dbeta.
template <typename BlockSums>
void sum_parameter_gradients(Rows r, BlockSums&& block, const Tensor& dgamma, const Tensor& dbeta, ParameterGradients& p) {
  std::tie(p.grad_sum, p.grad_dot_xhat) = channel_sums(r, block);
  for (std::int64_t c = 0; c < r.width; ++c) {
    device_data(dbeta)[c] = static_cast<float>(p.grad_sum[c]);
    device_data(dgamma)[c] = static_cast<float>(p.grad_dot_xhat[c]);
  }
}

// The parameter gradients in the portable loops, for the gradient g(m, c) of the normalized values.
template <class T, typename Gradient>
ParameterGradients parameter_gradients(const Tensor& x, Gradient&& gradient, const Tensor& mean,
                                       const Tensor& variance, float epsilon, const Tensor& dgamma,
                                       const Tensor& dbeta) {
  const Rows r = rows_of(x);
  const Elements<T> xp(x);
  const float* mp = device_data(mean);
  ParameterGradients p = inverse_std(variance, epsilon);
  const float* inv_std = p.inv_std.data();
  sum_parameter_gradients(
      r,
      term_sums(
          r.width, [=](std::int64_t m, std::int64_t c) { return gradient(m, c); },
          [=](std::int64_t m, std::int64_t c) { return gradient(m, c) * ((xp[m * r.width + c] - mp[c]) * inv_std[c]); }),
      dgamma, dbeta, p);
  return p;
}

// dx = gamma * inv_std / M * (M * g - sum(g) - xhat * sum(g * xhat)) = a * (g - b - (x - mean) * s) per channel.
struct DataGradientTerms {
  std::vector<float> a, b, s;
};

DataGradientTerms data_gradient_terms(Rows r, const Tensor& gamma, const ParameterGradients& p) {
  const float inverse_count = 1.0f / static_cast<float>(r.count);
  const auto channels = static_cast<std::size_t>(r.width);
  DataGradientTerms t{std::vector<float>(channels), std::vector<float>(channels), std::vector<float>(channels)};
  for (std::size_t c = 0; c < channels; ++c) {
    t.a[c] = device_data(gamma)[c] * p.inv_std[c];
    t.b[c] = static_cast<float>(p.grad_sum[c]) * inverse_count;
    t.s[c] = static_cast<float>(p.grad_dot_xhat[c]) * inverse_count * p.inv_std[c];
  }
  return t;
}

// Both backward passes for the gradient g(m, c) of the normalized values, after the forward's batch statistics.
template <class T, typename Gradient>
void backward_passes(const Tensor& x, Gradient&& gradient, const Tensor& gamma, const Tensor& batch_mean,
                     const Tensor& batch_variance, float epsilon, const Tensor& dx, const Tensor& dgamma,
                     const Tensor& dbeta) {
  const Rows r = rows_of(x);
  const Elements<T> xp(x);
  const float* mean = device_data(batch_mean);
  const ParameterGradients p = parameter_gradients<T>(x, gradient, batch_mean, batch_variance, epsilon, dgamma, dbeta);
  if (!dx.defined()) return;
  const DataGradientTerms t = data_gradient_terms(r, gamma, p);
  const float *a = t.a.data(), *b = t.b.data(), *s = t.s.data();
  const Elements<T> dp(dx);
#pragma omp parallel for
  for (std::int64_t m = 0; m < r.count; ++m) {
#pragma omp simd
    for (std::int64_t c = 0; c < r.width; ++c) {
      const std::int64_t i = m * r.width + c;
      dp.set(i, a[c] * (gradient(m, c) - b[c] - (xp[i] - mean[c]) * s[c]));
    }
  }
}

#if COHORT_WINOGRAD_X86_VARIANTS
// backward_passes through batch_norm_avx512.cpp's kernels, g being dy, masked by the ReLU recomputed from x
// with `affine` when `relu`.
template <class T>
void avx512_backward_passes(const Tensor& x, const Tensor& dy, const ChannelAffine* affine, bool relu,
                            const Tensor& gamma, const Tensor& batch_mean, const Tensor& batch_variance, float epsilon,
                            const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) {
  const Rows r = rows_of(x);
  const T* in = device_elements<T>(x);
  const T* gradient = device_elements<T>(dy);
  const float* multiplier = affine != nullptr ? affine->multiplier.data() : nullptr;
  const float* offset = affine != nullptr ? affine->offset.data() : nullptr;
  const float* mean = device_data(batch_mean);
  ParameterGradients p = inverse_std(batch_variance, epsilon);
  const float* inv_std = p.inv_std.data();
  sum_parameter_gradients(
      r,
      [&](std::int64_t begin, std::int64_t end, float* grad_sum, float* grad_dot_xhat) {
        const std::int64_t first = begin * r.width;
        avx512::gradient_moments(in + first, gradient + first, multiplier, offset, relu, mean, inv_std, end - begin,
                                 r.width, grad_sum, grad_dot_xhat);
      },
      dgamma, dbeta, p);
  if (!dx.defined()) return;
  const DataGradientTerms t = data_gradient_terms(r, gamma, p);
  T* out = device_elements<T>(dx);
  in_row_blocks(r.count, [&](std::int64_t begin, std::int64_t end) {
    const std::int64_t first = begin * r.width;
    avx512::data_gradient(in + first, gradient + first, multiplier, offset, relu, t.a.data(), t.b.data(), t.s.data(),
                          mean, end - begin, r.width, out + first);
  });
}
#endif

}  // namespace

void CpuBackend::batch_norm_backward(const PlanState*, const BatchNormGeometry& g, const Tensor& x,
                                     const Tensor& gamma, const Tensor& dy, const Tensor& batch_mean,
                                     const Tensor& batch_variance, const Tensor& dx, const Tensor& dgamma,
                                     const Tensor& dbeta) {
  const std::int64_t width = rows_of(x).width;
  with_stored(x.dtype(), [&](auto stored) {
    using T = decltype(stored);
#if COHORT_WINOGRAD_X86_VARIANTS
    if (avx512_passes(width, Activation::Linear))
      return avx512_backward_passes<T>(x, dy, nullptr, false, gamma, batch_mean, batch_variance, g.epsilon, dx, dgamma,
                                       dbeta);
#endif
    const Elements<T> gp(dy);
    const auto gradient = [=](std::int64_t m, std::int64_t c) { return gp[m * width + c]; };
    backward_passes<T>(x, gradient, gamma, batch_mean, batch_variance, g.epsilon, dx, dgamma, dbeta);
  });
}

void CpuBackend::batch_norm_activation_backward(const PlanState*, const BatchNormGeometry& g, const Tensor& x,
                                                const Tensor&, const Tensor& gamma, const Tensor& beta,
                                                const Tensor& dy, const Tensor& batch_mean,
                                                const Tensor& batch_variance, Activation activation,
                                                const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) {
  const std::int64_t width = rows_of(x).width;
  const ChannelAffine affine =
      channel_affine(width, device_data(batch_mean), device_data(batch_variance), gamma, beta, g.epsilon);
  const float* multiplier = affine.multiplier.data();
  const float* offset = affine.offset.data();
  with_stored(x.dtype(), [&](auto stored) {
    using T = decltype(stored);
#if COHORT_WINOGRAD_X86_VARIANTS
    if (avx512_passes(width, activation))
      return avx512_backward_passes<T>(x, dy, &affine, activation == Activation::Relu, gamma, batch_mean,
                                       batch_variance, g.epsilon, dx, dgamma, dbeta);
#endif
    const Elements<T> xp(x), gp(dy);
    with_activation(activation, [&](auto activate) {
      with_activation_gradient(activation, [&](auto activation_gradient) {
        // The activated output is recomputed from x as the forward pass computed it, before its rounding to
        // the stored type: two streams fewer than reading it and a separate activation gradient.
        const auto gradient = [=](std::int64_t m, std::int64_t c) {
          const std::int64_t i = m * width + c;
          return activation_gradient(activate(xp[i] * multiplier[c] + offset[c]), gp[i]);
        };
        backward_passes<T>(x, gradient, gamma, batch_mean, batch_variance, g.epsilon, dx, dgamma, dbeta);
      });
    });
  });
}

void CpuBackend::batch_norm_backward_inference(const PlanState*, const BatchNormGeometry& g, const Tensor& x,
                                               const Tensor& gamma, const Tensor& dy, const Tensor& mean,
                                               const Tensor& variance, const Tensor& dx, const Tensor& dgamma,
                                               const Tensor& dbeta) {
  const std::int64_t width = rows_of(x).width;
  with_stored(x.dtype(), [&](auto stored) {
    using T = decltype(stored);
    const Elements<T> gp(dy);
    const auto gradient = [=](std::int64_t m, std::int64_t c) { return gp[m * width + c]; };
    const ParameterGradients p = parameter_gradients<T>(x, gradient, mean, variance, g.epsilon, dgamma, dbeta);
    if (!dx.defined()) return;
    const Rows r = rows_of(x);
    const Elements<T> dp(dx);
#pragma omp parallel for
    for (std::int64_t m = 0; m < r.count; ++m)
      for (std::int64_t c = 0; c < r.width; ++c)
        dp.set(m * r.width + c, gp[m * r.width + c] * device_data(gamma)[c] * p.inv_std[c]);
  });
}

void CpuBackend::moving_average_update(const Tensor& moving, const Tensor& batch, float momentum) {
  float* mp = device_data(moving);
  const float* bp = device_data(batch);
  for (std::int64_t i = 0; i < moving.numel(); ++i) mp[i] = mp[i] * momentum + bp[i] * (1.0f - momentum);
}

}  // namespace cohort::cpu
