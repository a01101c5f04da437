#include "cohort/data/mapped_dataset.hpp"

#include "cohort/core/seed.hpp"

namespace cohort::data {

MappedDataset::MappedDataset(const Dataset& base, std::vector<Transform> transforms)
    : base_(base), transforms_(std::move(transforms)) {}

void MappedDataset::transform(std::int64_t index, float* sample) const {
  const Shape shape = base_.sample_shape();
  std::mt19937_64 rng(derive_seed(0, static_cast<std::uint64_t>(index)));
  for (const auto& t : transforms_) t({sample, static_cast<std::size_t>(shape.numel())}, shape, rng);
}

int MappedDataset::load(std::int64_t index, float* out) const {
  const int label = base_.load(index, out);
  transform(index, out);
  return label;
}

void MappedDataset::load_example(std::int64_t index, float* sample, float* target) const {
  base_.load_example(index, sample, target);
  transform(index, sample);
}

}  // namespace cohort::data
