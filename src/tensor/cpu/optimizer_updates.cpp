// Fused optimizer updates: one pass reads the gradient and the slots and writes the new value, so an
// update costs one sweep of memory per variable.
#include <cmath>

#include "cpu_backend.hpp"
#include "tensor/backend_access.hpp"

namespace cohort::cpu {
namespace {
constexpr std::int64_t kParallelThreshold = 1 << 15;
}

void CpuBackend::sgd_update(const Tensor& value, const Tensor& gradient, const Tensor& velocity, float learning_rate,
                float momentum, bool nesterov, float weight_decay) {
  float* w = device_data(value);
  const float* g = device_data(gradient);
  float* v = velocity.defined() ? device_data(velocity) : nullptr;
  const std::int64_t n = value.numel();
#pragma omp parallel for simd if (n > kParallelThreshold)
  for (std::int64_t i = 0; i < n; ++i) {
    const float grad = g[i] + weight_decay * w[i];
    if (v == nullptr) {
      w[i] -= learning_rate * grad;
      continue;
    }
    v[i] = momentum * v[i] - learning_rate * grad;
    w[i] += nesterov ? momentum * v[i] - learning_rate * grad : v[i];
  }
}

void CpuBackend::adam_update(const Tensor& value, const Tensor& gradient, const Tensor& m, const Tensor& v, float learning_rate,
                 float beta_1, float beta_2, float epsilon, float weight_decay) {
  float* w = device_data(value);
  const float* g = device_data(gradient);
  float* mp = device_data(m);
  float* vp = device_data(v);
  const std::int64_t n = value.numel();
#pragma omp parallel for simd if (n > kParallelThreshold)
  for (std::int64_t i = 0; i < n; ++i) {
    const float grad = g[i] + weight_decay * w[i];
    mp[i] = beta_1 * mp[i] + (1.0f - beta_1) * grad;
    vp[i] = beta_2 * vp[i] + (1.0f - beta_2) * grad * grad;
    w[i] -= learning_rate * mp[i] / (std::sqrt(vp[i]) + epsilon);
  }
}

void CpuBackend::rmsprop_update(const Tensor& value, const Tensor& gradient, const Tensor& mean_square, const Tensor& mean_gradient,
                    const Tensor& velocity, float learning_rate, float rho, float momentum, float epsilon,
                    float weight_decay) {
  float* w = device_data(value);
  const float* g = device_data(gradient);
  float* ms = device_data(mean_square);
  float* mg = mean_gradient.defined() ? device_data(mean_gradient) : nullptr;
  float* mom = velocity.defined() ? device_data(velocity) : nullptr;
  const std::int64_t n = value.numel();
#pragma omp parallel for if (n > kParallelThreshold)
  for (std::int64_t i = 0; i < n; ++i) {
    const float grad = g[i] + weight_decay * w[i];
    ms[i] = rho * ms[i] + (1.0f - rho) * grad * grad;
    float denominator = ms[i];
    if (mg != nullptr) {
      mg[i] = rho * mg[i] + (1.0f - rho) * grad;
      denominator -= mg[i] * mg[i];
    }
    if (mom != nullptr) {
      // Keras/TensorFlow ApplyRMSProp: epsilon inside the square root when momentum is used.
      mom[i] = momentum * mom[i] + learning_rate * grad / std::sqrt(denominator + epsilon);
      w[i] -= mom[i];
    } else {
      w[i] -= learning_rate * grad / (std::sqrt(denominator) + epsilon);
    }
  }
}

}  // namespace cohort::cpu
