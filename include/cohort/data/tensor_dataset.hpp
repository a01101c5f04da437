#pragma once
// TensorDataset: samples held in memory as floats, with class labels or float targets (regression,
// multi-label, soft targets), as torch.utils.data.TensorDataset or Keras' fit(x, y). It works with
// transforms, the loaders and every strategy like the file-backed sets.
//
//   data::TensorDataset points(Tensor::from_values({4, 2}, xy), std::vector<int>{0, 1, 1, 0}, /*num_classes=*/2);
//   data::TensorDataset curve({1}, inputs, /*target_shape=*/{1}, outputs);   // regression

#include <cstdint>
#include <string>
#include <vector>

#include "cohort/data/dataset.hpp"
#include "cohort/tensor/tensor.hpp"

namespace cohort::data {

class TensorDataset : public Dataset {
 public:
  // samples (N, ...sample shape) on the CPU; labels: N class indices in [0, num_classes).
  TensorDataset(const Tensor& samples, std::vector<int> labels, int num_classes,
                std::string description = "in-memory samples");
  // samples (N, ...sample shape) and targets (N, ...target shape) (or (N): one value each).
  TensorDataset(const Tensor& samples, const Tensor& targets, std::string description = "in-memory samples");
  // The same from flat vectors: N x sample_shape.numel() values, and N labels or N x target_shape.numel().
  TensorDataset(Shape sample_shape, std::vector<float> samples, std::vector<int> labels, int num_classes,
                std::string description = "in-memory samples");
  TensorDataset(Shape sample_shape, std::vector<float> samples, Shape target_shape, std::vector<float> targets,
                std::string description = "in-memory samples");

  std::int64_t size() const override { return size_; }
  Shape sample_shape() const override { return sample_shape_; }
  int num_classes() const override { return num_classes_; }
  // The class of a sample; an InvalidArgument for a set of float targets.
  int load(std::int64_t index, float* out) const override;
  Shape target_shape() const override { return target_shape_; }
  void load_example(std::int64_t index, float* sample, float* target) const override;
  std::string description() const override { return description_; }

 private:
  void check_index(std::int64_t index) const;

  Shape sample_shape_, target_shape_;
  std::int64_t size_ = 0;
  int num_classes_ = 0;
  std::vector<float> samples_, targets_;
  std::vector<int> labels_;
  std::string description_;
};

}  // namespace cohort::data
