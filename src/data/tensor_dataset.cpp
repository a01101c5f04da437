#include "cohort/data/tensor_dataset.hpp"

#include <algorithm>
#include <cmath>

#include "cohort/core/check.hpp"
#include "cohort/core/error.hpp"

namespace cohort::data {
namespace {

std::vector<float> host_values(const Tensor& tensor, const char* what) {
  COHORT_CHECK(tensor.defined() && tensor.rank() >= 1, "TensorDataset needs {} of shape (N, ...), got {}", what,
               tensor.defined() ? tensor.shape().to_string() : std::string("an undefined tensor"));
  return tensor.to(Device::CPU).to_vector();
}

// Names the first value that is NaN or infinite: it would poison every variable it reached.
void check_finite(const std::vector<float>& values, const Shape& shape, const char* what) {
  const auto bad = std::find_if(values.begin(), values.end(), [](float v) { return !std::isfinite(v); });
  if (bad == values.end()) return;
  const auto at = static_cast<std::int64_t>(bad - values.begin());
  throw InvalidArgument(fmt::format("TensorDataset: {} {} holds {} at position {}", what, at / shape.numel(), *bad,
                                    at % shape.numel()));
}

std::int64_t sample_count(const Shape& shape, std::size_t values, const char* what) {
  const std::int64_t per_sample = shape.numel();
  COHORT_CHECK(per_sample > 0, "TensorDataset: {} of shape {} hold no values", what, shape);
  COHORT_CHECK(static_cast<std::int64_t>(values) % per_sample == 0, "TensorDataset: {} values do not make whole {} of shape {}",
               values, what, shape);
  return static_cast<std::int64_t>(values) / per_sample;
}

}  // namespace

TensorDataset::TensorDataset(const Tensor& samples, std::vector<int> labels, int num_classes, std::string description)
    : TensorDataset(samples.defined() ? samples.shape().sample() : Shape{}, host_values(samples, "samples"),
                    std::move(labels), num_classes, std::move(description)) {}

TensorDataset::TensorDataset(const Tensor& samples, const Tensor& targets, std::string description)
    : TensorDataset(samples.defined() ? samples.shape().sample() : Shape{}, host_values(samples, "samples"),
                    !targets.defined() ? Shape{} : targets.rank() == 1 ? Shape{1} : targets.shape().sample(),
                    host_values(targets, "targets"),
                    std::move(description)) {}

TensorDataset::TensorDataset(Shape sample_shape, std::vector<float> samples, std::vector<int> labels, int num_classes,
                             std::string description)
    : sample_shape_(std::move(sample_shape)),
      size_(sample_count(sample_shape_, samples.size(), "samples")),
      num_classes_(num_classes),
      samples_(std::move(samples)),
      labels_(std::move(labels)),
      description_(std::move(description)) {
  COHORT_CHECK(num_classes_ >= 1, "TensorDataset needs num_classes >= 1, got {}", num_classes_);
  check_finite(samples_, sample_shape_, "sample");
  COHORT_CHECK(static_cast<std::int64_t>(labels_.size()) == size_, "TensorDataset: {} samples but {} labels", size_,
               labels_.size());
  for (std::size_t i = 0; i < labels_.size(); ++i)
    COHORT_CHECK(labels_[i] >= 0 && labels_[i] < num_classes_, "TensorDataset: label {} of sample {} is not in [0, {})",
                 labels_[i], i, num_classes_);
}

TensorDataset::TensorDataset(Shape sample_shape, std::vector<float> samples, Shape target_shape,
                             std::vector<float> targets, std::string description)
    : sample_shape_(std::move(sample_shape)),
      target_shape_(std::move(target_shape)),
      size_(sample_count(sample_shape_, samples.size(), "samples")),
      samples_(std::move(samples)),
      targets_(std::move(targets)),
      description_(std::move(description)) {
  COHORT_CHECK(target_shape_.rank() >= 1, "TensorDataset: targets need a shape per sample such as (1); for class "
               "indices pass integer labels");
  const std::int64_t target_count = sample_count(target_shape_, targets_.size(), "targets");
  check_finite(samples_, sample_shape_, "sample");
  check_finite(targets_, target_shape_, "target");
  COHORT_CHECK(target_count == size_, "TensorDataset: {} samples but {} targets", size_, target_count);
}

void TensorDataset::check_index(std::int64_t index) const {
  COHORT_CHECK(index >= 0 && index < size_, "sample index {} out of range [0, {})", index, size_);
}

int TensorDataset::load(std::int64_t index, float* out) const {
  if (labels_.empty())
    throw InvalidArgument(fmt::format("'{}' has float targets of shape {}, not class labels", description_, target_shape_));
  check_index(index);
  const std::int64_t n = sample_shape_.numel();
  std::copy_n(samples_.begin() + index * n, n, out);
  return labels_[static_cast<std::size_t>(index)];
}

void TensorDataset::load_example(std::int64_t index, float* sample, float* target) const {
  if (!labels_.empty()) {
    *target = static_cast<float>(load(index, sample));
    return;
  }
  check_index(index);
  const std::int64_t n = sample_shape_.numel(), t = target_shape_.numel();
  std::copy_n(samples_.begin() + index * n, n, sample);
  std::copy_n(targets_.begin() + index * t, t, target);
}

}  // namespace cohort::data
