#pragma once
// How backends reach a tensor's memory: only code under src/tensor/ includes this.
#include "cohort/tensor/tensor.hpp"
#include "tensor/storage.hpp"

namespace cohort::detail {

class BackendAccess {
 public:
  static std::byte* bytes(const Tensor& t) { return t.values_; }
  static Storage* storage(const Tensor& t) { return t.storage_.get(); }
};

}  // namespace cohort::detail

namespace cohort {
// The address of a tensor's values on its own device, for its backend's kernels. The op layer has checked
// element types before a kernel runs, so float32 kernels take device_data() and others device_bytes().
inline void* device_bytes(const Tensor& t) { return detail::BackendAccess::bytes(t); }
inline float* device_data(const Tensor& t) { return reinterpret_cast<float*>(detail::BackendAccess::bytes(t)); }
}  // namespace cohort
