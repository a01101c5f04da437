#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numbers>
#include <vector>

#include "cohort/core/check.hpp"
#include "cohort/core/seed.hpp"
#include "cohort/tensor/ops.hpp"
#include "cohort/train/gradient_codec.hpp"

namespace cohort::train {
namespace {

// A gradient as a matrix: its last axis the columns, the others the rows.
struct MatrixShape {
  std::int64_t rows = 0, columns = 0;
};

MatrixShape matrix_shape(const Tensor& gradient) {
  const std::int64_t columns = gradient.rank() == 0 ? 1 : gradient.dim(gradient.rank() - 1);
  return {columns == 0 ? 0 : gradient.numel() / columns, columns};
}

// Standard normal values from a seed of their own (Box-Muller over SplitMix64), the same on every replica.
Tensor random_factor(std::int64_t rows, std::int64_t columns, std::uint64_t seed, Device device) {
  std::vector<float> values(static_cast<std::size_t>(rows * columns));
  std::uint64_t state = seed;
  const auto uniform = [&] { return (static_cast<double>(mix64(state++) >> 11) + 0.5) * 0x1.0p-53; };
  for (float& v : values)
    v = static_cast<float>(std::sqrt(-2.0 * std::log(uniform())) * std::cos(2.0 * std::numbers::pi * uniform()));
  return Tensor::from_values({rows, columns}, values).to(device);
}

// Gram-Schmidt over the columns of `p` (rows x r), in double on the host, each projection taken twice
// ("twice is enough": orthogonal to float precision). A column that is nearly a combination of the earlier
// ones (the gradient's rank is below r) would be rounding noise blown up: it is left zero instead, so that
// its factor adds nothing.
void orthogonalize(const Tensor& p) {
  const std::int64_t rows = p.dim(0), rank = p.dim(1);
  std::vector<float> values = p.to_vector();
  std::vector<double> basis(static_cast<std::size_t>(rows * rank), 0.0), column(static_cast<std::size_t>(rows));
  const auto of = [&](std::vector<double>& m, std::int64_t row, std::int64_t col) -> double& {
    return m[static_cast<std::size_t>(row * rank + col)];
  };
  const auto norm_of = [&] {
    double sum = 0;
    for (double v : column) sum += v * v;
    return std::sqrt(sum);
  };
  for (std::int64_t c = 0; c < rank; ++c) {
    for (std::int64_t i = 0; i < rows; ++i) column[static_cast<std::size_t>(i)] = values[static_cast<std::size_t>(i * rank + c)];
    const double original = norm_of();
    for (int pass = 0; pass < 2; ++pass)
      for (std::int64_t earlier = 0; earlier < c; ++earlier) {
        double dot = 0;
        for (std::int64_t i = 0; i < rows; ++i) dot += column[static_cast<std::size_t>(i)] * of(basis, i, earlier);
        for (std::int64_t i = 0; i < rows; ++i) column[static_cast<std::size_t>(i)] -= dot * of(basis, i, earlier);
      }
    const double left = norm_of();
    const double inverse = left > 1e-5 * original && left > 0 ? 1.0 / left : 0.0;
    for (std::int64_t i = 0; i < rows; ++i) of(basis, i, c) = column[static_cast<std::size_t>(i)] * inverse;
  }
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(basis[i]);
  ops::copy(Tensor::from_values(p.shape(), values), p);
}

}  // namespace

void PowerSgd::warm_start(State& state, const Tensor& q, std::uint64_t seed) {
  // A factor left zero (its P column was dropped) would stay zero ever after: it starts afresh instead,
  // from values every replica draws alike.
  std::vector<float> values = q.to_vector();
  const std::int64_t columns = q.dim(0), rank = q.dim(1);
  Tensor fresh;
  for (std::int64_t k = 0; k < rank; ++k) {
    bool zero = true;
    for (std::int64_t i = 0; i < columns && zero; ++i) zero = values[static_cast<std::size_t>(i * rank + k)] == 0.0f;
    if (!zero) continue;
    if (!fresh.defined()) fresh = random_factor(columns, rank, derive_seed(seed, ++state.restarts), Device::CPU);
    for (std::int64_t i = 0; i < columns; ++i)
      values[static_cast<std::size_t>(i * rank + k)] = fresh.values()[static_cast<std::size_t>(i * rank + k)];
  }
  ops::copy(Tensor::from_values(q.shape(), values), state.q);
}

PowerSgd::PowerSgd(PowerSgdOptions options) : options_(options) {
  COHORT_CHECK(options_.rank >= 1, "PowerSGD: a rank of {}; it must be at least 1", options_.rank);
  COHORT_CHECK(std::isfinite(options_.min_compression) && options_.min_compression >= 0,
               "PowerSGD: a minimum compression of {}", options_.min_compression);
}

std::string PowerSgd::name() const { return fmt::format("powersgd:{}", options_.rank); }

void PowerSgd::reduce(std::span<const BucketGradient> gradients, ReplicaReduction& reduction) {
  struct Compressed {
    const BucketGradient* gradient;
    MatrixShape shape;
    std::int64_t rank;
    Tensor p, q;  // views into the packed factors
  };
  std::vector<const BucketGradient*> plain;
  std::vector<Compressed> compressed;
  std::int64_t plain_elements = 0, p_elements = 0, q_elements = 0;
  for (const BucketGradient& g : gradients) {
    const MatrixShape shape = matrix_shape(g.gradient);
    const std::int64_t rank = std::min<std::int64_t>({options_.rank, shape.rows, shape.columns});
    const bool worth_it = g.gradient.rank() >= 2 && rank > 0 &&
                          static_cast<double>(g.gradient.numel()) >= options_.min_compression * static_cast<double>(rank * (shape.rows + shape.columns));
    if (!worth_it) {
      plain.push_back(&g);
      plain_elements += g.gradient.numel();
      continue;
    }
    compressed.push_back({&g, shape, rank, {}, {}});
    p_elements += shape.rows * rank;
    q_elements += shape.columns * rank;
  }
  if (!plain.empty()) {  // one sum for all of them
    const Tensor packed({plain_elements}, plain.front()->gradient.device());
    std::int64_t at = 0;
    for (const auto* g : plain) {
      ops::copy(g->gradient.flat(), packed.slice(at, at + g->gradient.numel()));
      at += g->gradient.numel();
    }
    reduction.sum(packed);
    at = 0;
    for (const auto* g : plain) {
      ops::copy(packed.slice(at, at + g->gradient.numel()), g->gradient.flat());
      at += g->gradient.numel();
    }
  }
  if (compressed.empty()) return;
  const Device device = compressed.front().gradient->gradient.device();
  const Tensor ps({p_elements}, device), qs({q_elements}, device);
  std::int64_t p_at = 0, q_at = 0;
  for (Compressed& c : compressed) {
    c.p = ps.slice(p_at, p_at + c.shape.rows * c.rank).view({c.shape.rows, c.rank});
    c.q = qs.slice(q_at, q_at + c.shape.columns * c.rank).view({c.shape.columns, c.rank});
    p_at += c.shape.rows * c.rank;
    q_at += c.shape.columns * c.rank;
    State& state = state_[c.gradient->name];
    if (!state.q.defined() || state.q.shape() != c.q.shape() || state.q.device() != device) {
      state.q = random_factor(c.shape.columns, c.rank, derive_seed(options_.seed, c.gradient->name), device);
      state.error = Tensor({c.shape.rows, c.shape.columns}, device);
    }
    const Tensor m = c.gradient->gradient.view({c.shape.rows, c.shape.columns});
    if (options_.error_feedback) ops::axpy(1.0f, state.error, m);
    ops::matmul(m, false, state.q, false, c.p);  // P = M Q
  }
  reduction.sum(ps);
  for (const Compressed& c : compressed) {
    orthogonalize(c.p);
    ops::matmul(c.gradient->gradient.view({c.shape.rows, c.shape.columns}), true, c.p, false, c.q);  // Q = M^T P
  }
  reduction.sum(qs);
  const float share = 1.0f / static_cast<float>(reduction.replicas());
  for (const Compressed& c : compressed) {
    State& state = state_[c.gradient->name];
    const Tensor m = c.gradient->gradient.view({c.shape.rows, c.shape.columns});
    if (options_.error_feedback) ops::copy(m, state.error);
    ops::matmul(c.p, false, c.q, true, m);  // the sum's approximation, P Q^T
    // What this replica's share of the approximation misses of what it put in.
    if (options_.error_feedback) ops::axpy(-share, m, state.error);
    warm_start(state, c.q, derive_seed(options_.seed, c.gradient->name));
  }
}

GradientCodec parse_codec(std::string_view text) {
  constexpr std::string_view kPowerSgd = "powersgd";
  if (text == kPowerSgd) return PowerSgd();
  if (text.starts_with(kPowerSgd) && text.size() > kPowerSgd.size() + 1 && text[kPowerSgd.size()] == ':') {
    const std::string_view digits = text.substr(kPowerSgd.size() + 1);
    int rank = 0;
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), rank);
    if (error == std::errc() && end == digits.data() + digits.size() && rank >= 1 && rank <= 1024)
      return PowerSgd({.rank = rank});
  }
  throw InvalidArgument(fmt::format("gradient codec '{}': expected powersgd or powersgd:R with a rank R from 1 to 1024", text));
}

}  // namespace cohort::train
