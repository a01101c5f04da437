#include "cohort/data/mapped_dataset.hpp"

#include "cohort/core/seed.hpp"

namespace cohort::data {

MappedDataset::MappedDataset(const Dataset& base, std::vector<Transform> transforms)
    : base_(base), transforms_(std::move(transforms)) {}

int MappedDataset::load(std::int64_t index, float* out) const {
  const int label = base_.load(index, out);
  const Shape shape = base_.sample_shape();
  std::mt19937_64 rng(derive_seed(0, static_cast<std::uint64_t>(index)));
  for (const auto& transform : transforms_) transform({out, static_cast<std::size_t>(shape.numel())}, shape, rng);
  return label;
}

}  // namespace cohort::data
