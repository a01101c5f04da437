// Elementwise kernels, activations, bias and dropout for the CPU backend. Loops over large tensors are
// split across the OpenMP thread budget; small ones stay on the calling thread.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "activation_dispatch.hpp"
#include "cpu_backend.hpp"
#include "elements.hpp"
#include "scratch.hpp"
#include "tensor/activation_rules.hpp"
#include "tensor/backend_access.hpp"
#include "tensor/dropout_rule.hpp"

namespace cohort::cpu {

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
  const std::int64_t n = a.numel();
  with_stored(a.dtype(), [&](auto stored) {
    const Elements<decltype(stored)> ap(a), bp(b), op(out);
    in_blocks(n, [=](std::int64_t begin, std::int64_t end) {
#pragma omp simd
      for (std::int64_t i = begin; i < end; ++i) op.set(i, ap[i] * bp[i]);
    });
  });
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

void CpuBackend::add_bias(const Tensor& y, const Tensor& bias) { bias_activation_forward(y, bias, Activation::Linear); }

namespace {

// out[j] = sum over rows r of value(r, j) (overwrites). Large tensors: each thread sums a contiguous block
// of rows, the blocks' sums then added in thread order, so that a result depends on the thread count only.
template <typename Value>
void column_sums(std::int64_t rows, std::int64_t width, Value&& value, float* out) {
  const int threads = rows * width > kParallelThreshold ? omp_get_max_threads() : 1;
  float* partial = thread_scratch(ScratchSlot::ColumnSums, static_cast<std::size_t>(threads * width));
#pragma omp parallel num_threads(threads)
  {
    const int thread = omp_get_thread_num();
    float* mine = partial + thread * width;
    std::fill_n(mine, width, 0.0f);
    const std::int64_t first = rows * thread / threads, last = rows * (thread + 1) / threads;
    for (std::int64_t r = first; r < last; ++r) {
#pragma omp simd
      for (std::int64_t j = 0; j < width; ++j) mine[j] += value(r, j);
    }
  }
  sum_thread_partials(partial, threads, width, out);
}

}  // namespace

void CpuBackend::bias_gradient(const Tensor& dy, const Tensor& dbias) {
  const Rows layout = rows_of(dy);
  const float* dp = device_data(dy);
  const std::int64_t width = layout.width;
  column_sums(layout.count, width, [=](std::int64_t r, std::int64_t j) { return dp[r * width + j]; },
              device_data(dbias));
}

void CpuBackend::bias_activation_forward(const Tensor& y, const Tensor& bias, Activation activation) {
  const Rows layout = rows_of(y);
  const std::int64_t rows = layout.count, width = layout.width;
  float* yp = device_data(y);
  const float* bp = device_data(bias);
  with_activation(activation, [&](auto activate) {
#pragma omp parallel for if (y.numel() > kParallelThreshold)
    for (std::int64_t r = 0; r < rows; ++r) {
      float* row = yp + r * width;
#pragma omp simd
      for (std::int64_t j = 0; j < width; ++j) row[j] = activate(row[j] + bp[j]);
    }
  });
}

void CpuBackend::activation_bias_backward(Activation activation, const Tensor& y, const Tensor& dy, const Tensor& dpre,
                                          const Tensor& dbias) {
  const Rows layout = rows_of(y);
  const std::int64_t width = layout.width;
  const float* yp = device_data(y);
  const float* gp = device_data(dy);
  float* dp = device_data(dpre);
  // Summed as bias_gradient sums, so that fused and unfused gradients agree exactly.
  with_activation_gradient(activation, [&](auto gradient) {
    column_sums(
        layout.count, width,
        [=](std::int64_t r, std::int64_t j) {
          const std::int64_t i = r * width + j;
          return dp[i] = gradient(yp[i], gp[i]);
        },
        device_data(dbias));
  });
}

void CpuBackend::activation_forward(Activation activation, const Tensor& x, const Tensor& y) {
  const std::int64_t n = x.numel();
  if (activation == Activation::Softmax) {  // float32 only (ops.cpp)
    const float* xp = device_data(x);
    float* yp = device_data(y);
    const Rows layout = rows_of(x);
    const std::int64_t rows = layout.count, width = layout.width;
#pragma omp parallel for if (n > kParallelThreshold)
    for (std::int64_t r = 0; r < rows; ++r) activation_rules::softmax_row(xp + r * width, yp + r * width, width);
    return;
  }
  // No simd pragma, as before: Sigmoid's and Tanh's exponentials stay the scalar math library's; ReLU's
  // select vectorizes without it.
  with_stored(x.dtype(), [&](auto stored) {
    const Elements<decltype(stored)> in(x), out(y);
    with_activation(activation, [&](auto activate) {
      in_blocks(n, [=](std::int64_t begin, std::int64_t end) {
        for (std::int64_t i = begin; i < end; ++i) out.set(i, activate(in[i]));
      });
    });
  });
}

void CpuBackend::activation_backward(Activation activation, const Tensor& y, const Tensor& dy, const Tensor& dx) {
  const std::int64_t n = y.numel();
  if (activation == Activation::Softmax) {  // float32 only (ops.cpp)
    const float* yp = device_data(y);
    const float* gp = device_data(dy);
    float* dp = device_data(dx);
    const Rows layout = rows_of(y);
    const std::int64_t rows = layout.count, width = layout.width;
#pragma omp parallel for if (n > kParallelThreshold)
    for (std::int64_t r = 0; r < rows; ++r)
      activation_rules::softmax_backward_row(yp + r * width, gp + r * width, dp + r * width, width);
    return;
  }
  with_stored(y.dtype(), [&](auto stored) {
    const Elements<decltype(stored)> yp(y), gp(dy), dp(dx);
    with_activation_gradient(activation, [&](auto gradient) {
      in_blocks(n, [=](std::int64_t begin, std::int64_t end) {
#pragma omp simd
        for (std::int64_t i = begin; i < end; ++i) dp.set(i, gradient(yp[i], gp[i]));
      });
    });
  });
}

void CpuBackend::dropout_mask(const Tensor& mask, float rate, std::uint64_t seed, const Tensor& step) {
  const DropoutRule rule = DropoutRule::of(rate, step.defined() ? derive_seed(seed, step_of(step)) : seed);
  with_stored(mask.dtype(), [&](auto stored) {
    const Elements<decltype(stored)> p(mask);
    in_blocks(mask.numel(), [=](std::int64_t begin, std::int64_t end) {
      const DropoutRule draw = rule;  // a local copy: its fields in registers, so that the loop vectorizes
#pragma omp simd
      for (std::int64_t i = begin; i < end; ++i) p.set(i, draw(static_cast<std::uint64_t>(i)));
    });
  });
}

}  // namespace cohort::cpu
