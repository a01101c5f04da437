#include "cohort/nn/initializers.hpp"

#include <cmath>

#include "cohort/core/check.hpp"
#include "cohort/tensor/ops.hpp"

namespace cohort::nn::init {

void glorot_uniform(const Tensor& kernel, std::mt19937_64& rng) {
  COHORT_CHECK(kernel.rank() >= 2, "glorot_uniform needs a kernel of rank >= 2, got {}", kernel.shape());
  const std::int64_t receptive_field = kernel.numel() / (kernel.dim(kernel.rank() - 1) * kernel.dim(kernel.rank() - 2));
  const double fan_in = static_cast<double>(kernel.dim(kernel.rank() - 2) * receptive_field);
  const double fan_out = static_cast<double>(kernel.dim(kernel.rank() - 1) * receptive_field);
  const double limit = std::sqrt(6.0 / (fan_in + fan_out));
  std::uniform_real_distribution<double> uniform(-limit, limit);
  // Drawn on the host, in one order whatever the kernel's device, then copied there.
  const Tensor drawn(kernel.shape());
  for (float& v : drawn.values()) v = static_cast<float>(uniform(rng));
  ops::copy(drawn, kernel);
}

void constant(const Tensor& t, float value) { ops::fill(t, value); }

}  // namespace cohort::nn::init
