#pragma once
// Tensor: a dense, row-major array of one element type (DType: float32 unless asked) with a shape, on a device.
// Storage (kAlignment-aligned) comes from the device's allocator and is owned through a shared pointer;
// view() and slice() are cheap views that share it, clone() and to() copy. New tensors are zero-filled
// unless made uninitialized.
// Host code reads and writes values only on the CPU (data(), values(), data<T>()); anything else goes
// through ops or to(Device::CPU), so that a model on a GPU never touches device memory from the host.
// Host access names its element type: reading a bfloat16 tensor as float is an error, never a
// reinterpretation of its bytes.
//
//   Tensor x({2, 3});                         // float32 zeros, on the CPU
//   Tensor row = x.slice(1, 2);               // view of the second row, shape (1, 3)
//   Tensor on_device = x.to(Device::CUDA);    // a copy on the GPU; x.to(Device::CPU) is x itself
//   Tensor low = x.to(DType::BFloat16);       // converted, rounding to nearest even

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cohort/core/device.hpp"
#include "cohort/core/dtype.hpp"
#include "cohort/tensor/shape.hpp"

namespace cohort {

class Storage;
namespace detail {
class BackendAccess;
}

class Tensor {
 public:
  static constexpr std::size_t kAlignment = 64;

  Tensor() = default;
  explicit Tensor(Shape shape, Device device = Device::CPU);
  Tensor(Shape shape, DType dtype, Device device = Device::CPU);

  // Storage whose values are whatever the allocator handed out: for buffers that are written before read.
  static Tensor uninitialized(Shape shape, Device device = Device::CPU);
  static Tensor uninitialized(Shape shape, DType dtype, Device device = Device::CPU);
  // A zero-filled host tensor in page-locked memory, the fast source and target of device copies.
  static Tensor pinned(Shape shape, DType dtype = DType::Float32);
  static Tensor full(Shape shape, float value);
  static Tensor from_values(Shape shape, std::span<const float> values);
  // Class labels and other integers.
  static Tensor from_values(Shape shape, std::span<const std::int32_t> values);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  std::int64_t dim(int axis) const { return shape_[axis]; }
  std::int64_t numel() const { return shape_.numel(); }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * element_size(dtype_); }
  Device device() const { return device_; }
  DType dtype() const { return dtype_; }

  // Host access, for CPU tensors only: DeviceError on any other device, InvalidArgument naming both types
  // when T is not the tensor's element type. data() and values() are float32's.
  template <Element T>
  T* data() const {
    return static_cast<T*>(host_address(dtype_of<T>));
  }
  float* data() const { return data<float>(); }
  std::span<float> values() const { return {data(), static_cast<std::size_t>(numel())}; }
  // The elements' bytes, of any element type: for files and messages, which record the type beside them.
  std::span<std::byte> host_bytes() const { return {static_cast<std::byte*>(host_address(dtype_)), bytes()}; }
  // The float32 values on the host, from any device (a copy).
  std::vector<float> to_vector() const;

  // The tensor on `device`: itself when it is there already, else a copy.
  Tensor to(Device device) const;
  // The tensor in element type `dtype`, on the same device: itself when it has that type, else a
  // converted copy (floating types round to nearest even; NaN and infinity are kept).
  Tensor to(DType dtype) const;
  // A new tensor with the same values on the same device.
  Tensor clone() const;
  // The storage address, to hand to a library that works on this device (a communicator). Never
  // dereference it on the host unless device() is Device::CPU.
  void* device_pointer() const;
  // True while an asynchronous copy (CopyStream) reads or writes this tensor's storage.
  bool copy_in_flight() const;

  // A tensor with a new shape over the same storage; numel must match.
  Tensor view(Shape shape) const;
  // Every element along one axis, sharing storage.
  Tensor flat() const { return view({numel()}); }
  // Rows [begin, end) along axis 0, sharing storage.
  Tensor slice(std::int64_t begin, std::int64_t end) const;
  bool shares_storage_with(const Tensor& other) const { return storage_ == other.storage_; }

 private:
  friend class detail::BackendAccess;
  Tensor(Shape shape, DType dtype, Device device, bool zero_filled, bool pinned);
  void* host_address(DType wanted) const;

  std::shared_ptr<Storage> storage_;
  std::byte* values_ = nullptr;  // the storage's base plus this view's offset
  Shape shape_;
  Device device_ = Device::CPU;
  DType dtype_ = DType::Float32;
};

}  // namespace cohort
