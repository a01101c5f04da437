// Central differences in float32 need a large step and a relative error measure that tolerates the
// rounding of a sum over many terms; 1e-2 relative is the usual bar for float32 layers.
#include "cohort/nn/gradcheck.hpp"

#include <algorithm>
#include <cmath>
#include <random>

#include "cohort/tensor/ops.hpp"

namespace cohort::nn {
namespace {

void fill_uniform(const Tensor& t, std::mt19937_64& rng, double low, double high) {
  std::uniform_real_distribution<double> uniform(low, high);
  for (float& v : t.values()) v = static_cast<float>(uniform(rng));
}

}  // namespace

GradientCheckReport check_gradients(Layer& layer, const Shape& input_sample_shape, const GradientCheckOptions& options) {
  if (layer.name().empty()) layer.set_name(layer.name_stem());
  VariableFactory factory(layer.name(), options.seed, 0);
  const Shape output_sample_shape = layer.build(input_sample_shape, factory);
  std::mt19937_64 rng(options.seed);
  const Tensor x(input_sample_shape.batched(options.batch));
  fill_uniform(x, rng, -1.0, 1.0);
  const Tensor weights(output_sample_shape.batched(options.batch));
  fill_uniform(weights, rng, -1.0, 1.0);
  const ForwardContext context{options.training, 0};

  auto loss = [&]() {
    const Tensor y = layer.forward(x, context);
    double total = 0;
    for (std::int64_t i = 0; i < y.numel(); ++i) total += static_cast<double>(y.data()[i]) * weights.data()[i];
    return total;
  };

  loss();
  const Tensor dx = layer.backward(weights, true).clone();
  GradientCheckReport report;
  auto probe = [&](const std::string& label, const Tensor& value, const Tensor& analytic) {
    const std::int64_t stride = std::max<std::int64_t>(1, value.numel() / options.max_probes);
    for (std::int64_t i = 0; i < value.numel(); i += stride) {
      float& entry = value.data()[i];
      const float saved = entry;
      entry = static_cast<float>(saved + options.step);
      const double plus = loss();
      entry = static_cast<float>(saved - options.step);
      const double minus = loss();
      entry = saved;
      const double numeric = (plus - minus) / (2 * options.step);
      const double exact = analytic.data()[i];
      const double error = std::abs(numeric - exact) / std::max({1.0, std::abs(numeric), std::abs(exact)});
      if (error > report.max_relative_error) {
        report.max_relative_error = error;
        report.worst = fmt::format("{}[{}] numeric {:.6g} analytic {:.6g}", label, i, numeric, exact);
      }
    }
  };
  probe("input", x, dx);
  for (const auto& variable : layer.variables())
    if (variable->trainable) probe(variable->name, variable->value, variable->gradient.clone());
  return report;
}

}  // namespace cohort::nn
