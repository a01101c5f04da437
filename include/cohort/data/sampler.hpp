#pragma once
// Sampler: the order in which one epoch visits a data set. ShuffleSampler draws a fresh permutation
// per epoch from (seed, epoch), so any process can recompute any epoch's order without coordination.
//
//   data::ShuffleSampler sampler(dataset.size(), /*seed=*/42);
//   auto order = sampler.indices(/*epoch=*/3);

#include <cstdint>
#include <vector>

namespace cohort::data {

class Sampler {
 public:
  virtual ~Sampler() = default;
  virtual std::vector<std::int64_t> indices(std::int64_t epoch) const = 0;
};

class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(std::int64_t size) : size_(size) {}
  std::vector<std::int64_t> indices(std::int64_t epoch) const override;

 private:
  std::int64_t size_;
};

class ShuffleSampler : public Sampler {
 public:
  ShuffleSampler(std::int64_t size, std::uint64_t seed) : size_(size), seed_(seed) {}
  std::vector<std::int64_t> indices(std::int64_t epoch) const override;

 private:
  std::int64_t size_;
  std::uint64_t seed_;
};

}  // namespace cohort::data
