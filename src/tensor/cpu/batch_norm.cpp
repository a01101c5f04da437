// Batch normalization over the channels (last axis) of an (M x C) view of the input. Statistics are
// accumulated in double per thread over row blocks, then combined, so that large batches keep precision.
#include <omp.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "cpu_backend.hpp"
#include "tensor/backend_access.hpp"

namespace cohort::cpu {
namespace {

// Per-channel sums of two terms, first(m, c) and second(m, c), over all rows in one pass, computed in
// parallel and reduced in thread order (repeatable for a given thread count).
template <typename First, typename Second>
std::pair<std::vector<double>, std::vector<double>> channel_sums(Rows r, First&& first, Second&& second) {
  const int threads = omp_get_max_threads();
  const auto channels = static_cast<std::size_t>(r.width);
  std::vector<std::vector<double>> partial(static_cast<std::size_t>(threads), std::vector<double>(2 * channels, 0.0));
#pragma omp parallel
  {
    double* mine = partial[static_cast<std::size_t>(omp_get_thread_num())].data();
#pragma omp for schedule(static)
    for (std::int64_t m = 0; m < r.count; ++m) {
#pragma omp simd
      for (std::int64_t c = 0; c < r.width; ++c) {
        mine[c] += first(m, c);
        mine[channels + c] += second(m, c);
      }
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

// y = (x - mean) * gamma / sqrt(variance + epsilon) + beta, per channel.
void normalize(const Tensor& x, const float* mean, const float* variance, const Tensor& gamma, const Tensor& beta,
               float epsilon, const Tensor& y) {
  const Rows r = rows_of(x);
  std::vector<float> multiplier(static_cast<std::size_t>(r.width)), offset(static_cast<std::size_t>(r.width));
  for (std::int64_t c = 0; c < r.width; ++c) {
    multiplier[c] = device_data(gamma)[c] / std::sqrt(variance[c] + epsilon);
    offset[c] = device_data(beta)[c] - mean[c] * multiplier[c];
  }
  const float* xp = device_data(x);
  float* yp = device_data(y);
#pragma omp parallel for
  for (std::int64_t m = 0; m < r.count; ++m) {
#pragma omp simd
    for (std::int64_t c = 0; c < r.width; ++c) yp[m * r.width + c] = xp[m * r.width + c] * multiplier[c] + offset[c];
  }
}

}  // namespace

void CpuBackend::batch_norm_forward_training(const PlanState*, const BatchNormGeometry& g, const Tensor& x,
                                             const Tensor& gamma, const Tensor& beta, const Tensor& y,
                                             const Tensor& batch_mean, const Tensor& batch_variance) {
  const Rows r = rows_of(x);
  const float* xp = device_data(x);
  // One pass for both moments; double accumulators keep E[x^2] - E[x]^2 accurate for activations.
  const auto [sums, squares] = channel_sums(
      r, [&](std::int64_t m, std::int64_t c) { return static_cast<double>(xp[m * r.width + c]); },
      [&](std::int64_t m, std::int64_t c) {
        const double v = xp[m * r.width + c];
        return v * v;
      });
  const double inverse_count = 1.0 / static_cast<double>(r.count);
  for (std::int64_t c = 0; c < r.width; ++c) {
    const double mean = sums[c] * inverse_count;
    device_data(batch_mean)[c] = static_cast<float>(mean);
    device_data(batch_variance)[c] = static_cast<float>(std::max(squares[c] * inverse_count - mean * mean, 0.0));
  }
  normalize(x, device_data(batch_mean), device_data(batch_variance), gamma, beta, g.epsilon, y);
}

void CpuBackend::batch_norm_forward_inference(const PlanState*, const BatchNormGeometry& g, const Tensor& x,
                                              const Tensor& gamma, const Tensor& beta, const Tensor& mean,
                                              const Tensor& variance, const Tensor& y) {
  normalize(x, device_data(mean), device_data(variance), gamma, beta, g.epsilon, y);
}

namespace {

// What both backward passes share: 1 / sqrt(variance + epsilon), and the parameter gradients
// dbeta = sum(dy) and dgamma = sum(dy * xhat), kept in double for the data gradient.
struct ParameterGradients {
  std::vector<float> inv_std;
  std::vector<double> grad_sum, grad_dot_xhat;
};

ParameterGradients parameter_gradients(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& variance,
                                       float epsilon, const Tensor& dgamma, const Tensor& dbeta) {
  const Rows r = rows_of(x);
  const float* xp = device_data(x);
  const float* gp = device_data(dy);
  const float* mp = device_data(mean);
  ParameterGradients out;
  out.inv_std.resize(static_cast<std::size_t>(r.width));
  for (std::int64_t c = 0; c < r.width; ++c) out.inv_std[c] = 1.0f / std::sqrt(device_data(variance)[c] + epsilon);
  const float* inv_std = out.inv_std.data();
  std::tie(out.grad_sum, out.grad_dot_xhat) = channel_sums(
      r, [&](std::int64_t m, std::int64_t c) { return static_cast<double>(gp[m * r.width + c]); },
      [&](std::int64_t m, std::int64_t c) {
        return static_cast<double>(gp[m * r.width + c]) * (xp[m * r.width + c] - mp[c]) * inv_std[c];
      });
  for (std::int64_t c = 0; c < r.width; ++c) {
    device_data(dbeta)[c] = static_cast<float>(out.grad_sum[c]);
    device_data(dgamma)[c] = static_cast<float>(out.grad_dot_xhat[c]);
  }
  return out;
}

}  // namespace

void CpuBackend::batch_norm_backward(const PlanState*, const BatchNormGeometry& g, const Tensor& x,
                                     const Tensor& gamma, const Tensor& dy, const Tensor& batch_mean,
                                     const Tensor& batch_variance, const Tensor& dx, const Tensor& dgamma,
                                     const Tensor& dbeta) {
  const ParameterGradients p = parameter_gradients(x, dy, batch_mean, batch_variance, g.epsilon, dgamma, dbeta);
  if (!dx.defined()) return;
  // dx = gamma * inv_std / M * (M * dy - sum(dy) - xhat * sum(dy * xhat))
  const Rows r = rows_of(x);
  const float inverse_count = 1.0f / static_cast<float>(r.count);
  const auto channels = static_cast<std::size_t>(r.width);
  std::vector<float> a(channels), b(channels), s(channels);
  for (std::size_t c = 0; c < channels; ++c) {
    a[c] = device_data(gamma)[c] * p.inv_std[c];
    b[c] = static_cast<float>(p.grad_sum[c]) * inverse_count;
    s[c] = static_cast<float>(p.grad_dot_xhat[c]) * inverse_count * p.inv_std[c];
  }
  const float* xp = device_data(x);
  const float* gp = device_data(dy);
  const float* mean = device_data(batch_mean);
  float* dp = device_data(dx);
#pragma omp parallel for
  for (std::int64_t m = 0; m < r.count; ++m) {
#pragma omp simd
    for (std::int64_t c = 0; c < r.width; ++c) {
      const std::int64_t i = m * r.width + c;
      dp[i] = a[c] * (gp[i] - b[c] - (xp[i] - mean[c]) * s[c]);
    }
  }
}

void CpuBackend::batch_norm_backward_inference(const PlanState*, const BatchNormGeometry& g, const Tensor& x,
                                               const Tensor& gamma, const Tensor& dy, const Tensor& mean,
                                               const Tensor& variance, const Tensor& dx, const Tensor& dgamma,
                                               const Tensor& dbeta) {
  const ParameterGradients p = parameter_gradients(x, dy, mean, variance, g.epsilon, dgamma, dbeta);
  if (!dx.defined()) return;
  const Rows r = rows_of(x);
  const float* gp = device_data(dy);
  float* dp = device_data(dx);
#pragma omp parallel for
  for (std::int64_t m = 0; m < r.count; ++m)
    for (std::int64_t c = 0; c < r.width; ++c) dp[m * r.width + c] = gp[m * r.width + c] * device_data(gamma)[c] * p.inv_std[c];
}

void CpuBackend::moving_average_update(const Tensor& moving, const Tensor& batch, float momentum) {
  float* mp = device_data(moving);
  const float* bp = device_data(batch);
  for (std::int64_t i = 0; i < moving.numel(); ++i) mp[i] = mp[i] * momentum + bp[i] * (1.0f - momentum);
}

}  // namespace cohort::cpu
