#pragma once
// ImageDataset: 8-bit images held in memory (HWC, 1 byte per value) with integer labels; load()
// scales values to [0, 1]. CIFAR-10, Fashion-MNIST and the synthetic set all produce one.
//
//   data::ImageDataset small = data::FashionMnist::train().head(5000);

#include <cstdint>
#include <string>
#include <vector>

#include "cohort/data/dataset.hpp"

namespace cohort::data {

class ImageDataset : public Dataset {
 public:
  ImageDataset(Shape sample_shape, int num_classes, std::vector<std::uint8_t> pixels, std::vector<std::uint8_t> labels,
               std::string description);

  std::int64_t size() const override { return static_cast<std::int64_t>(labels_.size()); }
  Shape sample_shape() const override { return sample_shape_; }
  int num_classes() const override { return num_classes_; }
  int load(std::int64_t index, float* out) const override;
  bool stores_bytes() const override { return true; }
  int load_bytes(std::int64_t index, std::uint8_t* out) const override;
  std::string description() const override { return description_; }

  // The first `count` samples (all of them when count exceeds the size).
  ImageDataset head(std::int64_t count) const;
  const std::vector<std::uint8_t>& labels() const { return labels_; }

 private:
  Shape sample_shape_;
  int num_classes_;
  std::vector<std::uint8_t> pixels_;
  std::vector<std::uint8_t> labels_;
  std::string description_;
};

}  // namespace cohort::data
