#pragma once
// How backends reach a tensor's memory: only code under src/tensor/ includes this.
#include <cstring>

#include "cohort/core/check.hpp"
#include "cohort/tensor/running_sums.hpp"
#include "cohort/tensor/tensor.hpp"
#include "tensor/storage.hpp"

namespace cohort::detail {

class BackendAccess {
 public:
  static std::byte* bytes(const Tensor& t) { return t.values_; }
  static Storage* storage(const Tensor& t) { return t.storage_.get(); }
  static const Tensor& storage(const RunningSums& sums) { return sums.storage_; }
};

}  // namespace cohort::detail

namespace cohort {
// The address of a tensor's values on its own device, for its backend's kernels. The op layer has checked
// element types before a kernel runs, so float32 kernels take device_data() and others device_bytes().
inline void* device_bytes(const Tensor& t) { return detail::BackendAccess::bytes(t); }
inline float* device_data(const Tensor& t) { return reinterpret_cast<float*>(detail::BackendAccess::bytes(t)); }
// A step counter's value (ops::step_counter), for a backend whose device memory is the host's.
inline std::uint64_t step_of(const Tensor& step) {
  std::uint64_t value = 0;
  std::memcpy(&value, device_bytes(step), sizeof value);
  return value;
}

// Where a loss or a count adds its batch's sum: one slot of a RunningSums, on the backend's device.
struct SumTarget {
  double* sum;
  double* bad_label;  // the first label that was not a class index: its row + 1 (zero while none), value, the classes
};
inline SumTarget sum_target(const RunningSums& sums, int slot) {
  COHORT_CHECK(slot >= 0 && slot < sums.size(), "slot {} of running sums with {} slots", slot, sums.size());
  auto* base = static_cast<double*>(device_bytes(detail::BackendAccess::storage(sums)));
  return {base + slot, base + sums.size()};
}
}  // namespace cohort
