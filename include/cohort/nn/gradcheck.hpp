#pragma once
// Numerical gradient checking for layers: compares backward() with central finite differences of the
// scalar L = sum(forward(x) .* R) for a fixed random R, over the input and every trainable variable.
// Inputs are distinct, with magnitudes in [0.1, 1]: away from ReLU's kink and without ties for max
// pooling; the step shrinks below a third of the gap between inputs when needed.
// Ships with the library so that users can check the layers they write.
//
//   auto report = nn::check_gradients(layer, {5, 5, 3}, {.batch = 2});
//   REQUIRE(report.max_relative_error < 1e-2);

#include <cstdint>
#include <string>

#include "cohort/nn/layer.hpp"

namespace cohort::nn {

struct GradientCheckOptions {
  std::int64_t batch = 2;
  bool training = true;
  double step = 1e-3;             // largest finite-difference step
  std::uint64_t seed = 7;
  std::int64_t max_probes = 64;  // entries probed per tensor, spread evenly
};

struct GradientCheckReport {
  double max_relative_error = 0;  // |numeric - analytic| / max(1, |numeric|, |analytic|)
  std::string worst;              // "input[12]" or "dense/kernel[3]"
};

// Builds `layer` for the sample shape and checks it. The layer must be unbuilt.
GradientCheckReport check_gradients(Layer& layer, const Shape& input_sample_shape,
                                    const GradientCheckOptions& options = {});

}  // namespace cohort::nn
