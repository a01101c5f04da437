// Batch normalization over the channels (last axis) of an (M x C) view of the input. Statistics are summed
// in float over blocks of rows and the blocks' sums in double, so that large batches keep precision; the
// input's moments are taken about a per-channel shift (its first row) so that a large mean does not cancel.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "activation_dispatch.hpp"
#include "cpu_backend.hpp"
#include "elements.hpp"
#include "tensor/backend_access.hpp"

namespace cohort::cpu {
namespace {

// Per-channel sums of two float terms, first(m, c) and second(m, c), over all rows in one pass, computed in
// parallel and reduced in thread order (repeatable for a given thread count). Each block of kBlockRows rows
// is summed in float (twice the lanes of double), then added to the thread's double sums.
template <typename First, typename Second>
std::pair<std::vector<double>, std::vector<double>> channel_sums(Rows r, First&& first, Second&& second) {
  constexpr std::int64_t kBlockRows = 64;
  const int threads = omp_get_max_threads();
  const auto channels = static_cast<std::size_t>(r.width);
  const std::int64_t blocks = (r.count + kBlockRows - 1) / kBlockRows;
  std::vector<std::vector<double>> partial(static_cast<std::size_t>(threads), std::vector<double>(2 * channels, 0.0));
#pragma omp parallel
  {
    double* mine = partial[static_cast<std::size_t>(omp_get_thread_num())].data();
    std::vector<float> block_sums(2 * channels);
    float* block = block_sums.data();
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < blocks; ++b) {
      std::fill(block_sums.begin(), block_sums.end(), 0.0f);
      const std::int64_t end = b * kBlockRows + kBlockRows < r.count ? b * kBlockRows + kBlockRows : r.count;
      for (std::int64_t m = b * kBlockRows; m < end; ++m) {
#pragma omp simd
        for (std::int64_t c = 0; c < r.width; ++c) {
          block[c] += first(m, c);
          block[channels + c] += second(m, c);
        }
      }
      for (std::size_t c = 0; c < 2 * channels; ++c) mine[c] += block[c];
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
  const auto [sums, squares] = channel_sums(
      r, [&](std::int64_t m, std::int64_t c) { return xp[m * r.width + c] - shift[c]; },
      [&](std::int64_t m, std::int64_t c) {
        const float d = xp[m * r.width + c] - shift[c];
        return d * d;
      });
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

template <class T, typename Gradient>
ParameterGradients parameter_gradients(const Tensor& x, Gradient&& gradient, const Tensor& mean,
                                       const Tensor& variance, float epsilon, const Tensor& dgamma,
                                       const Tensor& dbeta) {
  const Rows r = rows_of(x);
  const Elements<T> xp(x);
  const float* mp = device_data(mean);
  ParameterGradients out;
  out.inv_std.resize(static_cast<std::size_t>(r.width));
  for (std::int64_t c = 0; c < r.width; ++c) out.inv_std[c] = 1.0f / std::sqrt(device_data(variance)[c] + epsilon);
  const float* inv_std = out.inv_std.data();
  std::tie(out.grad_sum, out.grad_dot_xhat) = channel_sums(
      r, [&](std::int64_t m, std::int64_t c) { return gradient(m, c); },
      [&](std::int64_t m, std::int64_t c) { return gradient(m, c) * ((xp[m * r.width + c] - mp[c]) * inv_std[c]); });
  for (std::int64_t c = 0; c < r.width; ++c) {
    device_data(dbeta)[c] = static_cast<float>(out.grad_sum[c]);
    device_data(dgamma)[c] = static_cast<float>(out.grad_dot_xhat[c]);
  }
  return out;
}

// dx = gamma * inv_std / M * (M * g - sum(g) - xhat * sum(g * xhat)) for the gradient g(m, c) of the
// normalized values, after parameter_gradients.
template <class T, typename Gradient>
void data_gradient(const Tensor& x, Gradient&& gradient, const Tensor& gamma, const Tensor& batch_mean,
                   const ParameterGradients& p, const Tensor& dx) {
  const Rows r = rows_of(x);
  const float inverse_count = 1.0f / static_cast<float>(r.count);
  const auto channels = static_cast<std::size_t>(r.width);
  std::vector<float> a(channels), b(channels), s(channels);
  for (std::size_t c = 0; c < channels; ++c) {
    a[c] = device_data(gamma)[c] * p.inv_std[c];
    b[c] = static_cast<float>(p.grad_sum[c]) * inverse_count;
    s[c] = static_cast<float>(p.grad_dot_xhat[c]) * inverse_count * p.inv_std[c];
  }
  const Elements<T> xp(x), dp(dx);
  const float* mean = device_data(batch_mean);
#pragma omp parallel for
  for (std::int64_t m = 0; m < r.count; ++m) {
#pragma omp simd
    for (std::int64_t c = 0; c < r.width; ++c) {
      const std::int64_t i = m * r.width + c;
      dp.set(i, a[c] * (gradient(m, c) - b[c] - (xp[i] - mean[c]) * s[c]));
    }
  }
}

}  // namespace

void CpuBackend::batch_norm_backward(const PlanState*, const BatchNormGeometry& g, const Tensor& x,
                                     const Tensor& gamma, const Tensor& dy, const Tensor& batch_mean,
                                     const Tensor& batch_variance, const Tensor& dx, const Tensor& dgamma,
                                     const Tensor& dbeta) {
  const std::int64_t width = rows_of(x).width;
  with_stored(x.dtype(), [&](auto stored) {
    using T = decltype(stored);
    const Elements<T> gp(dy);
    const auto gradient = [=](std::int64_t m, std::int64_t c) { return gp[m * width + c]; };
    const ParameterGradients p = parameter_gradients<T>(x, gradient, batch_mean, batch_variance, g.epsilon, dgamma, dbeta);
    if (dx.defined()) data_gradient<T>(x, gradient, gamma, batch_mean, p, dx);
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
    const Elements<T> xp(x), gp(dy);
    with_activation(activation, [&](auto activate) {
      with_activation_gradient(activation, [&](auto activation_gradient) {
        // The activated output is recomputed from x as the forward pass computed it, before its rounding to
        // the stored type: two streams fewer than reading it and a separate activation gradient.
        const auto gradient = [=](std::int64_t m, std::int64_t c) {
          const std::int64_t i = m * width + c;
          return activation_gradient(activate(xp[i] * multiplier[c] + offset[c]), gp[i]);
        };
        const ParameterGradients p =
            parameter_gradients<T>(x, gradient, batch_mean, batch_variance, g.epsilon, dgamma, dbeta);
        if (dx.defined()) data_gradient<T>(x, gradient, gamma, batch_mean, p, dx);
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
