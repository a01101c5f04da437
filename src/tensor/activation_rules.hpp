#pragma once
// The activation functions and their gradients, written once for the CPU loops and the CUDA kernels so
// that both devices do the same arithmetic in the same order. Gradients take the forward *output* y.
// Softmax acts on one row of `width` values; its sums are kept in double.
#include <cmath>
#include <cstdint>

#include "tensor/host_device.hpp"

namespace cohort::activation_rules {

COHORT_HOST_DEVICE inline float relu(float x) { return x > 0.0f ? x : 0.0f; }
COHORT_HOST_DEVICE inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
COHORT_HOST_DEVICE inline float tanh(float x) { return std::tanh(x); }

COHORT_HOST_DEVICE inline float relu_gradient(float y, float dy) { return y > 0.0f ? dy : 0.0f; }
COHORT_HOST_DEVICE inline float sigmoid_gradient(float y, float dy) { return dy * y * (1.0f - y); }
COHORT_HOST_DEVICE inline float tanh_gradient(float y, float dy) { return dy * (1.0f - y * y); }

// out = exp(in - max(in)) / sum, the maximum being the first largest value.
COHORT_HOST_DEVICE inline void softmax_row(const float* in, float* out, std::int64_t width) {
  float peak = in[0];
  for (std::int64_t j = 1; j < width; ++j)
    if (peak < in[j]) peak = in[j];
  double total = 0;
  for (std::int64_t j = 0; j < width; ++j) total += out[j] = std::exp(in[j] - peak);
  const float inverse = static_cast<float>(1.0 / total);
  for (std::int64_t j = 0; j < width; ++j) out[j] *= inverse;
}

// dx = y * (dy - <dy, y>)
COHORT_HOST_DEVICE inline void softmax_backward_row(const float* y, const float* dy, float* dx, std::int64_t width) {
  double inner = 0;
  for (std::int64_t j = 0; j < width; ++j) inner += static_cast<double>(y[j]) * dy[j];
  for (std::int64_t j = 0; j < width; ++j) dx[j] = y[j] * (dy[j] - static_cast<float>(inner));
}

}  // namespace cohort::activation_rules
