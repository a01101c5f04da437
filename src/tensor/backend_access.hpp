#pragma once
// How backends reach a tensor's memory: only code under src/tensor/ includes this.
#include "cohort/tensor/tensor.hpp"
#include "tensor/storage.hpp"

namespace cohort::detail {

class BackendAccess {
 public:
  static float* data(const Tensor& t) { return t.values_; }
  static Storage* storage(const Tensor& t) { return t.storage_.get(); }
};

}  // namespace cohort::detail

namespace cohort {
// The address of a tensor's values on its own device, for its backend's kernels.
inline float* device_data(const Tensor& t) { return detail::BackendAccess::data(t); }
}  // namespace cohort
