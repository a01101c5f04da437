#pragma once
// The element-wise losses and hits at one output, written once for the CPU loops and the CUDA kernels so
// that both devices do the same arithmetic, in double as Keras' reference values are.
#include <cmath>

#include "cohort/tensor/geometry.hpp"
#include "tensor/host_device.hpp"

namespace cohort::loss_rules {

// Keras clips probabilities to [epsilon, 1 - epsilon] before a binary cross-entropy takes their logarithm.
constexpr double kProbabilityEpsilon = 1e-7;

// The value at prediction p and target z; `d` receives its derivative with respect to p (zero for hits,
// and where a clipped probability makes the loss flat).
COHORT_HOST_DEVICE inline double elementwise_loss(ElementwiseLoss loss, double p, double z, double& d) {
  switch (loss) {
    case ElementwiseLoss::SquaredError:
      d = 2.0 * (p - z);
      return (p - z) * (p - z);
    case ElementwiseLoss::AbsoluteError:
      d = p > z ? 1.0 : (p < z ? -1.0 : 0.0);
      return std::fabs(p - z);
    case ElementwiseLoss::BinaryCrossEntropy: {
      const double q = p < kProbabilityEpsilon ? kProbabilityEpsilon
                                               : (p > 1.0 - kProbabilityEpsilon ? 1.0 - kProbabilityEpsilon : p);
      d = p == q ? (1.0 - z) / (1.0 - q) - z / q : 0.0;
      return -(z * std::log(q) + (1.0 - z) * std::log(1.0 - q));
    }
    case ElementwiseLoss::BinaryCrossEntropyOfLogits:
      // max(p, 0) - p z + log(1 + exp(-|p|)): no exponential of a large positive logit.
      d = 1.0 / (1.0 + std::exp(-p)) - z;
      return (p > 0.0 ? p : 0.0) - p * z + std::log1p(std::exp(-std::fabs(p)));
    case ElementwiseLoss::BinaryHits: d = 0.0; return (p > 0.5) == (z > 0.5) ? 1.0 : 0.0;
    case ElementwiseLoss::BinaryHitsOfLogits: d = 0.0; return (p > 0.0) == (z > 0.5) ? 1.0 : 0.0;
  }
  d = 0.0;
  return 0.0;
}

}  // namespace cohort::loss_rules
