// Elementwise kernels, activations, bias and dropout for the CPU backend. Loops over large tensors are
// split across the OpenMP thread budget; small ones stay on the calling thread.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cohort/core/seed.hpp"
#include "cpu_backend.hpp"
#include "tensor/backend_access.hpp"

namespace cohort::cpu {
namespace {

constexpr std::int64_t kParallelThreshold = 1 << 15;

// Rows of the last axis: (rows, width) of a tensor viewed as a matrix.
std::pair<std::int64_t, std::int64_t> as_rows(const Tensor& t) {
  const std::int64_t width = t.rank() == 0 ? 1 : t.dim(t.rank() - 1);
  return {width == 0 ? 0 : t.numel() / width, width};
}

}  // namespace

void CpuBackend::fill(const Tensor& x, float value) {
  float* p = device_data(x);
  const std::int64_t n = x.numel();
#pragma omp parallel for simd if (n > kParallelThreshold)
  for (std::int64_t i = 0; i < n; ++i) p[i] = value;
}

void CpuBackend::copy(const Tensor& source, const Tensor& destination) {
  if (device_data(source) != device_data(destination) && source.numel() > 0) std::memmove(device_data(destination), device_data(source), source.bytes());
}

void CpuBackend::axpy(float alpha, const Tensor& x, const Tensor& y) {
  const float* xp = device_data(x);
  float* yp = device_data(y);
  const std::int64_t n = x.numel();
#pragma omp parallel for simd if (n > kParallelThreshold)
  for (std::int64_t i = 0; i < n; ++i) yp[i] += alpha * xp[i];
}

void CpuBackend::scale(const Tensor& x, float alpha) {
  float* p = device_data(x);
  const std::int64_t n = x.numel();
#pragma omp parallel for simd if (n > kParallelThreshold)
  for (std::int64_t i = 0; i < n; ++i) p[i] *= alpha;
}

void CpuBackend::multiply(const Tensor& a, const Tensor& b, const Tensor& out) {
  const float* ap = device_data(a);
  const float* bp = device_data(b);
  float* op = device_data(out);
  const std::int64_t n = a.numel();
#pragma omp parallel for simd if (n > kParallelThreshold)
  for (std::int64_t i = 0; i < n; ++i) op[i] = ap[i] * bp[i];
}

double CpuBackend::sum(const Tensor& x) {
  const float* p = device_data(x);
  double total = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) total += p[i];
  return total;
}

double CpuBackend::sum_of_squares(const Tensor& x) {
  const float* p = device_data(x);
  double total = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) total += static_cast<double>(p[i]) * p[i];
  return total;
}

void CpuBackend::add_bias(const Tensor& y, const Tensor& bias) {
  const auto [rows, width] = as_rows(y);
  float* yp = device_data(y);
  const float* bp = device_data(bias);
#pragma omp parallel for if (y.numel() > kParallelThreshold)
  for (std::int64_t r = 0; r < rows; ++r) {
    float* row = yp + r * width;
#pragma omp simd
    for (std::int64_t j = 0; j < width; ++j) row[j] += bp[j];
  }
}

void CpuBackend::bias_gradient(const Tensor& dy, const Tensor& dbias) {
  const auto [rows, width] = as_rows(dy);
  const float* dp = device_data(dy);
  float* out = device_data(dbias);
  std::fill_n(out, width, 0.0f);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = dp + r * width;
#pragma omp simd
    for (std::int64_t j = 0; j < width; ++j) out[j] += row[j];
  }
}

void CpuBackend::activation_forward(Activation activation, const Tensor& x, const Tensor& y) {
  const float* xp = device_data(x);
  float* yp = device_data(y);
  const std::int64_t n = x.numel();
  switch (activation) {
    case Activation::Linear:
      copy(x, y);
      return;
    case Activation::Relu:
#pragma omp parallel for simd if (n > kParallelThreshold)
      for (std::int64_t i = 0; i < n; ++i) yp[i] = xp[i] > 0.0f ? xp[i] : 0.0f;
      return;
    case Activation::Sigmoid:
#pragma omp parallel for if (n > kParallelThreshold)
      for (std::int64_t i = 0; i < n; ++i) yp[i] = 1.0f / (1.0f + std::exp(-xp[i]));
      return;
    case Activation::Tanh:
#pragma omp parallel for if (n > kParallelThreshold)
      for (std::int64_t i = 0; i < n; ++i) yp[i] = std::tanh(xp[i]);
      return;
    case Activation::Softmax: {
      const auto [rows, width] = as_rows(x);
#pragma omp parallel for if (n > kParallelThreshold)
      for (std::int64_t r = 0; r < rows; ++r) {
        const float* in = xp + r * width;
        float* out = yp + r * width;
        const float peak = *std::max_element(in, in + width);
        double total = 0;
        for (std::int64_t j = 0; j < width; ++j) total += out[j] = std::exp(in[j] - peak);
        const float inverse = static_cast<float>(1.0 / total);
        for (std::int64_t j = 0; j < width; ++j) out[j] *= inverse;
      }
      return;
    }
  }
}

void CpuBackend::activation_backward(Activation activation, const Tensor& y, const Tensor& dy, const Tensor& dx) {
  const float* yp = device_data(y);
  const float* gp = device_data(dy);
  float* dp = device_data(dx);
  const std::int64_t n = y.numel();
  switch (activation) {
    case Activation::Linear:
      copy(dy, dx);
      return;
    case Activation::Relu:
#pragma omp parallel for simd if (n > kParallelThreshold)
      for (std::int64_t i = 0; i < n; ++i) dp[i] = yp[i] > 0.0f ? gp[i] : 0.0f;
      return;
    case Activation::Sigmoid:
#pragma omp parallel for simd if (n > kParallelThreshold)
      for (std::int64_t i = 0; i < n; ++i) dp[i] = gp[i] * yp[i] * (1.0f - yp[i]);
      return;
    case Activation::Tanh:
#pragma omp parallel for simd if (n > kParallelThreshold)
      for (std::int64_t i = 0; i < n; ++i) dp[i] = gp[i] * (1.0f - yp[i] * yp[i]);
      return;
    case Activation::Softmax: {
      // dx = y * (dy - <dy, y>) row by row
      const auto [rows, width] = as_rows(y);
#pragma omp parallel for if (n > kParallelThreshold)
      for (std::int64_t r = 0; r < rows; ++r) {
        const float* yr = yp + r * width;
        const float* gr = gp + r * width;
        float* dr = dp + r * width;
        double inner = 0;
        for (std::int64_t j = 0; j < width; ++j) inner += static_cast<double>(yr[j]) * gr[j];
        for (std::int64_t j = 0; j < width; ++j) dr[j] = yr[j] * (gr[j] - static_cast<float>(inner));
      }
      return;
    }
  }
}

void CpuBackend::dropout_mask(const Tensor& mask, float rate, std::uint64_t seed) {
  float* p = device_data(mask);
  const std::int64_t n = mask.numel();
  const float keep_scale = 1.0f / (1.0f - rate);
  // Compare 53-bit uniform draws with the rate.
  const auto threshold = static_cast<std::uint64_t>(static_cast<double>(rate) * 9007199254740992.0);
  // A counter-based generator: element i's draw does not depend on which thread computes it.
  const std::uint64_t key = mix64(seed);
#pragma omp parallel for simd if (n > kParallelThreshold)
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint64_t draw = mix64(key ^ static_cast<std::uint64_t>(i)) >> 11;
    p[i] = draw < threshold ? 0.0f : keep_scale;
  }
}

}  // namespace cohort::cpu
