// Central differences in float32 need a large step and a relative error measure that tolerates the
// rounding of a sum over many terms; 1e-2 relative is the usual bar for float32 layers.
#include "cohort/nn/gradcheck.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "cohort/tensor/ops.hpp"

namespace cohort::nn {
namespace {

void fill_uniform(const Tensor& t, std::mt19937_64& rng, double low, double high) {
  std::uniform_real_distribution<double> uniform(low, high);
  for (float& v : t.values()) v = static_cast<float>(uniform(rng));
}

// Distinct magnitudes 0.1 + 0.9 k / n in random order with random signs: no input lies near ReLU's kink
// and no two inputs tie, so max pooling's choice cannot flip within a finite-difference step.
// Returns the smallest gap between two inputs.
double fill_distinct(const Tensor& t, std::mt19937_64& rng) {
  const std::int64_t n = t.numel();
  std::vector<std::int64_t> rank(static_cast<std::size_t>(n));
  std::iota(rank.begin(), rank.end(), 0);
  std::shuffle(rank.begin(), rank.end(), rng);
  std::bernoulli_distribution negative(0.5);
  const double gap = 0.9 / static_cast<double>(std::max<std::int64_t>(n, 1));
  for (std::int64_t i = 0; i < n; ++i) {
    const double magnitude = 0.1 + gap * static_cast<double>(rank[static_cast<std::size_t>(i)]);
    t.data()[i] = static_cast<float>(negative(rng) ? -magnitude : magnitude);
  }
  return gap;
}

}  // namespace

GradientCheckReport check_gradients(Layer& layer, const Shape& input_sample_shape, const GradientCheckOptions& options) {
  if (layer.name().empty()) layer.set_name(layer.name_stem());
  VariableFactory factory(layer.name(), options.seed, 0);
  const Shape output_sample_shape = layer.build(input_sample_shape, factory);
  std::mt19937_64 rng(options.seed);
  const Tensor x(input_sample_shape.batched(options.batch));
  const double step = std::min(options.step, fill_distinct(x, rng) / 3);
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
      entry = static_cast<float>(saved + step);
      const double plus = loss();
      entry = static_cast<float>(saved - step);
      const double minus = loss();
      entry = saved;
      const double numeric = (plus - minus) / (2 * step);
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
