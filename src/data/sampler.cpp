#include "cohort/data/sampler.hpp"

#include <algorithm>
#include <numeric>
#include <random>

#include "cohort/core/seed.hpp"

namespace cohort::data {

std::vector<std::int64_t> SequentialSampler::indices(std::int64_t) const {
  std::vector<std::int64_t> order(static_cast<std::size_t>(size_));
  std::iota(order.begin(), order.end(), 0);
  return order;
}

std::vector<std::int64_t> ShuffleSampler::indices(std::int64_t epoch) const {
  std::vector<std::int64_t> order(static_cast<std::size_t>(size_));
  std::iota(order.begin(), order.end(), 0);
  // Fisher-Yates with an explicit generator: std::shuffle's algorithm is implementation-defined.
  std::mt19937_64 rng(derive_seed(seed_, static_cast<std::uint64_t>(epoch)));
  for (std::size_t i = order.size(); i > 1; --i) {
    const std::size_t j = static_cast<std::size_t>(rng() % i);
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

}  // namespace cohort::data
