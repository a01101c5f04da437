// Fused optimizer updates: one pass reads the gradient and the slots and writes the new value, so an
// update costs one sweep of memory per variable. The variables of one call are updated one after the
// other, each pass spread over the threads.
#include <cmath>

#include "cpu_backend.hpp"
#include "tensor/backend_access.hpp"

namespace cohort::cpu {
namespace {

constexpr std::int64_t kParallelThreshold = 1 << 15;

float* optional_data(const Tensor& t) { return t.defined() ? device_data(t) : nullptr; }

}  // namespace

void CpuBackend::sgd_update(const std::vector<ops::SgdOperands>& variables, float learning_rate, float momentum,
                            bool nesterov, float weight_decay) {
  for (const ops::SgdOperands& variable : variables) {
    float* w = device_data(variable.value);
    const float* g = device_data(variable.gradient);
    float* v = optional_data(variable.velocity);
    const std::int64_t n = variable.value.numel();
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
}

void CpuBackend::adam_update(const std::vector<ops::AdamOperands>& variables, float learning_rate, float beta_1,
                             float beta_2, float epsilon, float weight_decay) {
  for (const ops::AdamOperands& variable : variables) {
    float* w = device_data(variable.value);
    const float* g = device_data(variable.gradient);
    float* mp = device_data(variable.m);
    float* vp = device_data(variable.v);
    const std::int64_t n = variable.value.numel();
#pragma omp parallel for simd if (n > kParallelThreshold)
    for (std::int64_t i = 0; i < n; ++i) {
      const float grad = g[i] + weight_decay * w[i];
      mp[i] = beta_1 * mp[i] + (1.0f - beta_1) * grad;
      vp[i] = beta_2 * vp[i] + (1.0f - beta_2) * grad * grad;
      w[i] -= learning_rate * mp[i] / (std::sqrt(vp[i]) + epsilon);
    }
  }
}

void CpuBackend::rmsprop_update(const std::vector<ops::RmspropOperands>& variables, float learning_rate, float rho,
                                float momentum, float epsilon, float weight_decay) {
  for (const ops::RmspropOperands& variable : variables) {
    float* w = device_data(variable.value);
    const float* g = device_data(variable.gradient);
    float* ms = device_data(variable.mean_square);
    float* mg = optional_data(variable.mean_gradient);
    float* mom = optional_data(variable.velocity);
    const std::int64_t n = variable.value.numel();
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
}

}  // namespace cohort::cpu
