#pragma once
// Tensor: a dense, row-major float32 array with a shape and a device tag.
// Storage is owned through a shared pointer and 64-byte aligned; view() and slice() are cheap views that
// share it, clone() copies. New tensors are zero-filled.
//
//   Tensor x({2, 3});                 // zeros
//   Tensor row = x.slice(1, 2);       // view of the second row, shape (1, 3)
//   Tensor flat = x.view({6});        // same storage, new shape

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cohort/tensor/device.hpp"
#include "cohort/tensor/shape.hpp"

namespace cohort {

class Tensor {
 public:
  static constexpr std::size_t kAlignment = 64;

  Tensor() = default;
  explicit Tensor(Shape shape, Device device = Device::CPU);

  static Tensor full(Shape shape, float value);
  static Tensor from_values(Shape shape, std::span<const float> values);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  std::int64_t dim(int axis) const { return shape_[axis]; }
  std::int64_t numel() const { return shape_.numel(); }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * sizeof(float); }
  Device device() const { return device_; }

  // Host pointers; valid for CPU tensors only (checked).
  float* data() const;
  std::span<float> values() const { return {data(), static_cast<std::size_t>(numel())}; }
  std::vector<float> to_vector() const;

  // Raw pointer for backends, without the device check.
  float* raw() const { return storage_.get() + offset_; }

  // A tensor with a new shape over the same storage; numel must match.
  Tensor view(Shape shape) const;
  // Rows [begin, end) along axis 0, sharing storage.
  Tensor slice(std::int64_t begin, std::int64_t end) const;
  Tensor clone() const;
  bool shares_storage_with(const Tensor& other) const { return storage_ == other.storage_; }

 private:
  std::shared_ptr<float> storage_;
  std::int64_t offset_ = 0;
  Shape shape_;
  Device device_ = Device::CPU;
};

}  // namespace cohort
