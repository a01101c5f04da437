// Fused optimizer updates: one pass reads the gradient and the slots and writes the new value, so an
// update costs one sweep of memory per variable. The variables of one call are updated one after the
// other, each pass spread over the threads; the rules themselves are in tensor/update_rules.hpp.
#include "cpu_backend.hpp"
#include "tensor/backend_access.hpp"
#include "tensor/update_rules.hpp"

namespace cohort::cpu {
namespace {

float* optional_data(const Tensor& t) { return t.defined() ? device_data(t) : nullptr; }

// SGD in one of its three forms (plain, with momentum, Nesterov), and RMSprop in one of its four (centered
// or not, with momentum or not), each without a branch per element, so that each vectorizes (a loop choosing
// the form per element ran scalar).
template <bool kMomentum, bool kNesterov>
void sgd_pass(float* w, const float* g, float* v, std::int64_t n, float learning_rate, float momentum, float weight_decay) {
#pragma omp parallel for simd if (n > kParallelThreshold)
  for (std::int64_t i = 0; i < n; ++i)
    update_rules::sgd(w[i], g[i], kMomentum ? v + i : nullptr, learning_rate, momentum, kNesterov, weight_decay);
}

template <bool kCentered, bool kMomentum>
void rmsprop_pass(float* w, const float* g, float* ms, float* mg, float* velocity, std::int64_t n, float learning_rate,
                  float rho, float momentum, float epsilon, float weight_decay) {
#pragma omp parallel for simd if (n > kParallelThreshold)
  for (std::int64_t i = 0; i < n; ++i)
    update_rules::rmsprop(w[i], g[i], ms[i], kCentered ? mg + i : nullptr, kMomentum ? velocity + i : nullptr, learning_rate,
                          rho, momentum, epsilon, weight_decay);
}

}  // namespace

void CpuBackend::sgd_update(const std::vector<ops::SgdOperands>& variables, const Tensor& rate, float momentum,
                            bool nesterov, float weight_decay) {
  const float learning_rate = *device_data(rate);
  for (const ops::SgdOperands& variable : variables) {
    float* w = device_data(variable.value);
    const float* g = device_data(variable.gradient);
    float* v = optional_data(variable.velocity);
    const std::int64_t n = variable.value.numel();
    const auto pass = v == nullptr ? sgd_pass<false, false> : nesterov ? sgd_pass<true, true> : sgd_pass<true, false>;
    pass(w, g, v, n, learning_rate, momentum, weight_decay);
  }
}

void CpuBackend::adam_update(const std::vector<ops::AdamOperands>& variables, const Tensor& rate, float beta_1,
                             float beta_2, float epsilon, float weight_decay) {
  const float learning_rate = *device_data(rate);
  for (const ops::AdamOperands& variable : variables) {
    float* w = device_data(variable.value);
    const float* g = device_data(variable.gradient);
    float* m = device_data(variable.m);
    float* v = device_data(variable.v);
    const std::int64_t n = variable.value.numel();
#pragma omp parallel for simd if (n > kParallelThreshold)
    for (std::int64_t i = 0; i < n; ++i)
      update_rules::adam(w[i], g[i], m[i], v[i], learning_rate, beta_1, beta_2, epsilon, weight_decay);
  }
}

void CpuBackend::rmsprop_update(const std::vector<ops::RmspropOperands>& variables, const Tensor& rate, float rho,
                                float momentum, float epsilon, float weight_decay) {
  const float learning_rate = *device_data(rate);
  for (const ops::RmspropOperands& variable : variables) {
    float* w = device_data(variable.value);
    const float* g = device_data(variable.gradient);
    float* ms = device_data(variable.mean_square);
    float* mg = optional_data(variable.mean_gradient);
    float* velocity = optional_data(variable.velocity);
    const std::int64_t n = variable.value.numel();
    const auto pass = mg != nullptr ? (velocity != nullptr ? rmsprop_pass<true, true> : rmsprop_pass<true, false>)
                                    : (velocity != nullptr ? rmsprop_pass<false, true> : rmsprop_pass<false, false>);
    pass(w, g, ms, mg, velocity, n, learning_rate, rho, momentum, epsilon, weight_decay);
  }
}

}  // namespace cohort::cpu
