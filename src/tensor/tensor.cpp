#include "cohort/tensor/tensor.hpp"

#include <cstdlib>
#include <cstring>

#include "cohort/core/check.hpp"
#include "cohort/core/config.hpp"

namespace cohort {
namespace {

std::shared_ptr<float> allocate(std::int64_t count, Device device) {
  if (device != Device::CPU) {
    throw DeviceError(fmt::format("cannot allocate a {} tensor: this build of cohort (CUDA {}) has no backend for it",
                                  device_name(device), COHORT_HAS_CUDA ? "found" : "not found"));
  }
  const std::size_t bytes = static_cast<std::size_t>(count) * sizeof(float);
  // aligned_alloc needs a size that is a multiple of the alignment; never ask for zero bytes.
  const std::size_t rounded = std::max<std::size_t>(Tensor::kAlignment,
                                                    (bytes + Tensor::kAlignment - 1) / Tensor::kAlignment * Tensor::kAlignment);
  auto* memory = static_cast<float*>(std::aligned_alloc(Tensor::kAlignment, rounded));
  if (memory == nullptr) throw std::bad_alloc();
  std::memset(memory, 0, rounded);
  return std::shared_ptr<float>(memory, [](float* p) { std::free(p); });
}

}  // namespace

Tensor::Tensor(Shape shape, Device device) : shape_(std::move(shape)), device_(device) {
  for (auto d : shape_.dims()) COHORT_CHECK(d >= 0, "tensor extents must be non-negative, got {}", shape_);
  storage_ = allocate(shape_.numel(), device_);
}

Tensor Tensor::full(Shape shape, float value) {
  Tensor t(std::move(shape));
  std::fill_n(t.data(), t.numel(), value);
  return t;
}

Tensor Tensor::from_values(Shape shape, std::span<const float> values) {
  Tensor t(std::move(shape));
  COHORT_CHECK(static_cast<std::int64_t>(values.size()) == t.numel(), "{} values do not fill shape {}",
               values.size(), t.shape());
  std::copy(values.begin(), values.end(), t.data());
  return t;
}

float* Tensor::data() const {
  COHORT_CHECK(defined(), "tensor has no storage");
  COHORT_CHECK(device_ == Device::CPU, "host access to a {} tensor", device_name(device_));
  return raw();
}

std::vector<float> Tensor::to_vector() const {
  auto v = values();
  return {v.begin(), v.end()};
}

Tensor Tensor::view(Shape shape) const {
  COHORT_CHECK(shape.numel() == numel(), "cannot view shape {} as {}", shape_, shape);
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::slice(std::int64_t begin, std::int64_t end) const {
  COHORT_CHECK(rank() >= 1 && 0 <= begin && begin <= end && end <= dim(0), "slice [{}, {}) out of range for {}",
               begin, end, shape_);
  Tensor t = *this;
  const std::int64_t row = dim(0) == 0 ? 0 : numel() / dim(0);
  t.offset_ += begin * row;
  t.shape_[0] = end - begin;
  return t;
}

Tensor Tensor::clone() const {
  Tensor t(shape_, device_);
  if (numel() > 0) std::memcpy(t.raw(), raw(), bytes());
  return t;
}

}  // namespace cohort
