#include "cohort/tensor/running_sums.hpp"

#include <algorithm>
#include <cstring>
#include <functional>

#include "cohort/core/check.hpp"
#include "tensor/backend.hpp"

namespace cohort {

namespace {

std::size_t checked_size(int size) {
  COHORT_CHECK(size >= 0, "running sums need a slot count of zero or more, got {}", size);
  return static_cast<std::size_t>(size);
}

}  // namespace

RunningSums::RunningSums(Device device, int size) : host_(checked_size(size), 0.0) {
  storage_ = Tensor(Shape{static_cast<std::int64_t>((host_.size() + kBadLabelRecord) * sizeof(double))}, DType::UInt8, device);
}

void RunningSums::add(int slot, double value) {
  COHORT_CHECK(slot >= 0 && slot < size(), "slot {} of running sums with {} slots", slot, size());
  host_[static_cast<std::size_t>(slot)] += value;
}

std::vector<double> RunningSums::read() const {
  COHORT_CHECK(storage_.defined(), "reading running sums that were never made");
  const Tensor on_host = storage_.to(Device::CPU);
  std::vector<double> values(static_cast<std::size_t>(size() + kBadLabelRecord));
  std::memcpy(values.data(), on_host.host_bytes().data(), values.size() * sizeof(double));
  const double* bad = values.data() + size();
  if (bad[0] > 0)
    throw InvalidArgument(fmt::format("label {} of row {} is not a class index in [0, {})", bad[1],
                                      static_cast<std::int64_t>(bad[0]) - 1, static_cast<std::int64_t>(bad[2])));
  values.resize(host_.size());
  std::transform(values.begin(), values.end(), host_.begin(), values.begin(), std::plus<>());
  return values;
}

void RunningSums::reset() {
  COHORT_CHECK(storage_.defined(), "resetting running sums that were never made");
  backend_for(device()).zero(storage_);
  std::fill(host_.begin(), host_.end(), 0.0);
}

}  // namespace cohort
