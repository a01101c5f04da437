#include "cohort/tensor/copy_stream.hpp"

#include "cohort/core/check.hpp"
#include "tensor/backend.hpp"
#include "tensor/backend_access.hpp"

namespace cohort {

CopyStream::CopyStream(Device device) : device_(device), stream_(backend_for(device).make_stream()) {}

CopyStream::~CopyStream() {
  try {
    stream_->synchronize();
  } catch (...) {
    // A failed copy nobody waited for: its tensors are released below all the same.
  }
  release_in_flight();
}

void CopyStream::copy(const Tensor& source, const Tensor& destination) {
  COHORT_CHECK(source.defined() && destination.defined(), "CopyStream::copy: undefined tensor");
  COHORT_CHECK(source.shape() == destination.shape(), "CopyStream::copy: {} into {}", source.shape(),
               destination.shape());
  for (const Tensor* t : {&source, &destination}) {
    if (t->device() != device_ && t->device() != Device::CPU)
      throw DeviceError(fmt::format("CopyStream on {}: cannot copy a tensor of shape {} on {}", device_name(device_),
                                    t->shape(), device_name(t->device())));
  }
  if (destination.copy_in_flight())
    throw DeviceError(fmt::format("CopyStream::copy: the destination of shape {} on {} is already being copied into",
                                  destination.shape(), device_name(destination.device())));
  for (const Tensor* t : {&source, &destination}) {
    ++detail::BackendAccess::storage(*t)->copies_in_flight();
    in_flight_.push_back(*t);
  }
  stream_->enqueue_copy(source, destination);
}

void CopyStream::synchronize() {
  try {
    stream_->synchronize();
  } catch (...) {
    release_in_flight();
    throw;
  }
  release_in_flight();
}

void CopyStream::release_in_flight() noexcept {
  for (const Tensor& t : in_flight_) --detail::BackendAccess::storage(t)->copies_in_flight();
  in_flight_.clear();
}

}  // namespace cohort
