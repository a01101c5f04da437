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
  if (source.device() != device_ && destination.device() != device_)
    throw DeviceError(fmt::format("CopyStream on {}: a copy from {} to {} does not touch this stream's device",
                                  device_name(device_), device_name(source.device()),
                                  device_name(destination.device())));
  Storage& from = *detail::BackendAccess::storage(source);
  Storage& into = *detail::BackendAccess::storage(destination);
  // A copy may read what other copies read; nothing may read or write what a copy writes.
  if (from.copies_writing().load() > 0)
    throw DeviceError(fmt::format("CopyStream::copy: the source of shape {} on {} is still being copied into; call "
                                  "synchronize() first",
                                  source.shape(), device_name(source.device())));
  if (into.copy_in_flight())
    throw DeviceError(fmt::format("CopyStream::copy: the destination of shape {} on {} is still being copied; call "
                                  "synchronize() first",
                                  destination.shape(), device_name(destination.device())));
  in_flight_.reserve(in_flight_.size() + 1);  // nothing below may fail between marking and queueing
  ++from.copies_reading();
  ++into.copies_writing();
  try {
    stream_->enqueue_copy(source, destination);
  } catch (...) {
    --from.copies_reading();
    --into.copies_writing();
    throw;
  }
  in_flight_.push_back({source, destination});
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
  for (const auto& [source, destination] : in_flight_) {
    --detail::BackendAccess::storage(source)->copies_reading();
    --detail::BackendAccess::storage(destination)->copies_writing();
  }
  in_flight_.clear();
}

}  // namespace cohort
