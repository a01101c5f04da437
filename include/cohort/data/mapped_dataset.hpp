#pragma once
// MappedDataset: a view of another data set with transforms applied on load(), for evaluation data
// that needs the training set's normalization. The random stream handed to the transforms is seeded by
// the sample index, so every load() of a sample gives the same values.
//
//   data::MappedDataset test_view(test_set, {data::normalize(stats.mean, stats.stddev)});

#include <vector>

#include "cohort/data/transforms.hpp"

namespace cohort::data {

class MappedDataset : public Dataset {
 public:
  // `base` must outlive this view.
  MappedDataset(const Dataset& base, std::vector<Transform> transforms);

  std::int64_t size() const override { return base_.size(); }
  Shape sample_shape() const override { return base_.sample_shape(); }
  int num_classes() const override { return base_.num_classes(); }
  int load(std::int64_t index, float* out) const override;
  Shape target_shape() const override { return base_.target_shape(); }
  void load_example(std::int64_t index, float* sample, float* target) const override;
  std::string description() const override { return base_.description(); }

 private:
  void transform(std::int64_t index, float* sample) const;

  const Dataset& base_;
  std::vector<Transform> transforms_;
};

}  // namespace cohort::data
