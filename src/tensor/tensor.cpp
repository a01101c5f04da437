#include "cohort/tensor/tensor.hpp"

#include <cstring>

#include "cohort/core/check.hpp"
#include "cohort/tensor/ops.hpp"
#include "tensor/backend.hpp"
#include "tensor/backend_access.hpp"

namespace cohort {

Tensor::Tensor(Shape shape, Device device) : Tensor(std::move(shape), DType::Float32, device, true, false) {}

Tensor::Tensor(Shape shape, DType dtype, Device device) : Tensor(std::move(shape), dtype, device, true, false) {}

Tensor::Tensor(Shape shape, DType dtype, Device device, bool zero_filled, bool pinned)
    : shape_(std::move(shape)), device_(device), dtype_(dtype) {
  // The byte count must be representable before numel() or bytes() are trusted.
  std::int64_t elements = 1;
  for (auto d : shape_.dims()) {
    COHORT_CHECK(d >= 0, "tensor extents must be non-negative, got {}", shape_);
    COHORT_CHECK(!__builtin_mul_overflow(elements, d, &elements) && elements <= (std::int64_t{1} << 60) / 4,
                 "tensor of shape {} is too large to allocate", shape_);
  }
  Allocator& allocator = pinned ? pinned_host_allocator() : allocator_for(device);
  storage_ = std::make_shared<Storage>(bytes(), device, allocator);
  values_ = storage_->data();
  if (!zero_filled || numel() == 0) return;
  if (device == Device::CPU) std::memset(values_, 0, bytes());
  else backend_for(device).zero(*this);  // all-zero bits are zero in every element type
}

Tensor Tensor::uninitialized(Shape shape, Device device) {
  return Tensor(std::move(shape), DType::Float32, device, false, false);
}

Tensor Tensor::uninitialized(Shape shape, DType dtype, Device device) {
  return Tensor(std::move(shape), dtype, device, false, false);
}

Tensor Tensor::pinned(Shape shape, DType dtype) { return Tensor(std::move(shape), dtype, Device::CPU, true, true); }

Tensor Tensor::full(Shape shape, float value) {
  Tensor t(std::move(shape));
  std::fill_n(t.data(), t.numel(), value);
  return t;
}

namespace {

template <Element T>
Tensor holding(Shape shape, std::span<const T> values) {
  Tensor t(std::move(shape), dtype_of<T>);
  COHORT_CHECK(static_cast<std::int64_t>(values.size()) == t.numel(), "{} values do not fill shape {}",
               values.size(), t.shape());
  std::copy(values.begin(), values.end(), t.data<T>());
  return t;
}

}  // namespace

Tensor Tensor::from_values(Shape shape, std::span<const float> values) { return holding(std::move(shape), values); }

Tensor Tensor::from_values(Shape shape, std::span<const std::int32_t> values) {
  return holding(std::move(shape), values);
}

void* Tensor::host_address(DType wanted) const {
  COHORT_CHECK(defined(), "tensor has no storage");
  if (wanted != dtype_) [[unlikely]]
    throw InvalidArgument(fmt::format("host access as {} to a {} tensor of shape {}: convert it with to(DType::...) "
                                      "first",
                                      dtype_name(wanted), dtype_name(dtype_), shape_));
  if (device_ != Device::CPU) [[unlikely]]
    throw DeviceError(fmt::format("host access to a tensor of shape {} on {}: copy it to the host with "
                                  "to(Device::CPU) or compute on it with ops",
                                  shape_, device_name(device_)));
  if (storage_->copy_in_flight()) [[unlikely]]
    throw DeviceError(fmt::format("host access to a tensor of shape {} that a CopyStream is still copying; call its "
                                  "synchronize() first",
                                  shape_));
  return values_;
}

std::vector<float> Tensor::to_vector() const {
  const Tensor host = to(Device::CPU).to(DType::Float32);
  auto v = host.values();
  return {v.begin(), v.end()};
}

Tensor Tensor::to(Device device) const {
  COHORT_CHECK(defined(), "to({}): tensor has no storage", device_name(device));
  if (device == device_) return *this;
  Tensor moved = uninitialized(shape_, dtype_, device);
  ops::copy(*this, moved);
  return moved;
}

Tensor Tensor::to(DType dtype) const {
  COHORT_CHECK(defined(), "to({}): tensor has no storage", dtype_name(dtype));
  if (dtype == dtype_) return *this;
  Tensor converted = uninitialized(shape_, dtype, device_);
  ops::convert(*this, converted);
  return converted;
}

Tensor Tensor::clone() const {
  COHORT_CHECK(defined(), "clone(): tensor has no storage");
  Tensor t = uninitialized(shape_, dtype_, device_);
  ops::copy(*this, t);
  return t;
}

void* Tensor::device_pointer() const { return values_; }

bool Tensor::copy_in_flight() const { return storage_ != nullptr && storage_->copy_in_flight(); }

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
  t.values_ += static_cast<std::size_t>(begin * row) * element_size(dtype_);
  t.shape_[0] = end - begin;
  return t;
}

}  // namespace cohort
