#include "cohort/data/image_dataset.hpp"

#include <algorithm>

#include "cohort/core/check.hpp"

namespace cohort::data {

ImageDataset::ImageDataset(Shape sample_shape, int num_classes, std::vector<std::uint8_t> pixels,
                           std::vector<std::uint8_t> labels, std::string description)
    : sample_shape_(std::move(sample_shape)),
      num_classes_(num_classes),
      pixels_(std::move(pixels)),
      labels_(std::move(labels)),
      description_(std::move(description)) {
  COHORT_CHECK(static_cast<std::int64_t>(pixels_.size()) == size() * sample_shape_.numel(),
               "{} pixel values do not make {} samples of {}", pixels_.size(), size(), sample_shape_);
  for (std::size_t i = 0; i < labels_.size(); ++i)
    COHORT_CHECK(labels_[i] < num_classes_, "label {} of sample {} is not below {} classes", labels_[i], i, num_classes_);
}

int ImageDataset::load_bytes(std::int64_t index, std::uint8_t* out) const {
  COHORT_CHECK(index >= 0 && index < size(), "sample index {} out of range [0, {})", index, size());
  const std::int64_t n = sample_shape_.numel();
  std::copy_n(pixels_.data() + index * n, n, out);
  return labels_[static_cast<std::size_t>(index)];
}

int ImageDataset::load(std::int64_t index, float* out) const {
  COHORT_CHECK(index >= 0 && index < size(), "sample index {} out of range [0, {})", index, size());
  const std::int64_t n = sample_shape_.numel();
  const std::uint8_t* in = pixels_.data() + index * n;
  constexpr float kScale = 1.0f / 255.0f;
  for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]) * kScale;
  return labels_[static_cast<std::size_t>(index)];
}

ImageDataset ImageDataset::head(std::int64_t count) const {
  const std::int64_t n = std::clamp<std::int64_t>(count, 0, size());
  const std::int64_t values = n * sample_shape_.numel();
  return ImageDataset(sample_shape_, num_classes_, {pixels_.begin(), pixels_.begin() + values},
                      {labels_.begin(), labels_.begin() + n}, fmt::format("{} (first {})", description_, n));
}

}  // namespace cohort::data
