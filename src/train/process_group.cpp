#include "cohort/train/process_group.hpp"

#include <algorithm>

#include "cohort/comm/nccl.hpp"
#include "cohort/core/check.hpp"
#include "cohort/core/logging.hpp"
#include "cohort/tensor/devices.hpp"
#include "cohort/tensor/ops.hpp"

namespace cohort::train {

ProcessGroup::ProcessGroup(std::vector<std::shared_ptr<comm::Communicator>> communicators)
    : communicators_(std::move(communicators)) {
  COHORT_CHECK(!communicators_.empty(), "a process group needs a communicator");
  for (const auto& c : communicators_) {
    COHORT_CHECK(c != nullptr, "a process group got a null communicator");
    COHORT_CHECK(c->rank() == communicators_[0]->rank() && c->size() == communicators_[0]->size(),
                 "communicators '{}' (rank {} of {}) and '{}' (rank {} of {}) span different groups", c->name(),
                 c->rank(), c->size(), communicators_[0]->name(), communicators_[0]->rank(), communicators_[0]->size());
    if (host_ == nullptr && c->accepts(Device::CPU)) host_ = c.get();
  }
}

std::pair<comm::Communicator*, bool> ProcessGroup::communicator_for(Device device) const {
  for (const auto& c : communicators_)
    if (c->accepts(device)) return {c.get(), true};
  return {communicators_.front().get(), false};
}

bool ProcessGroup::sum_over_replicas(std::span<double> values) {
  COHORT_CHECK(host_ != nullptr, "none of the communicators takes host memory");
  // Gathered as raw bytes (a double is two float slots) and added in rank order: exact, and the same
  // on every rank, which a float reduction would be neither.
  const auto ranks = static_cast<std::size_t>(size());
  auto mine = std::make_shared<std::vector<double>>(values.begin(), values.end());
  auto all = std::make_shared<std::vector<double>>(values.size() * ranks);
  const std::size_t slots = values.size() * sizeof(double) / sizeof(float);
  const comm::Buffer mine_buffer{mine->data(), slots, DType::Float32, Device::CPU, mine};
  const comm::Buffer all_buffer{all->data(), slots * ranks, DType::Float32, Device::CPU, all};
  host_->allgather(mine_buffer, all_buffer)->wait(host_->timeout());
  for (std::size_t i = 0; i < values.size(); ++i) {
    double sum = 0;
    for (std::size_t r = 0; r < ranks; ++r) sum += (*all)[r * values.size() + i];
    values[i] = sum;
  }
  return true;
}

void ProcessGroup::announce_failure(const std::string& reason) {
  for (const auto& communicator : communicators_) communicator->announce_failure(reason);
}

void ProcessGroup::prefer_gpu_communicator(Device device, DType wire) {
  if (!comm::nccl_available()) return;
  if (wire != DType::Float32) {
    if (device == Device::CUDA && is_chief())
      log::info("{} gradients travel through pinned host memory over the ring", dtype_name(wire));
    return;
  }
  for (const auto& c : communicators_)
    if (c->accepts(Device::CUDA)) return;  // the caller chose one
  if (host_ == nullptr) return;
  std::string why_not;
  auto nccl = comm::make_nccl_communicator(*host_, device == Device::CUDA ? cuda_device_index() : -1, why_not);
  if (nccl) {
    communicators_.insert(communicators_.begin(), std::shared_ptr<comm::Communicator>(std::move(nccl)));
    if (is_chief()) log::info("gradients travel over NCCL, from GPU to GPU");
  } else if (device == Device::CUDA && is_chief()) {
    log::info("gradients travel through pinned host memory over {}: {}", host_->name(), why_not);
  }
}

void ProcessGroup::expect_buffers_up_to(std::uint64_t bytes) {
  largest_buffer_ = std::max(largest_buffer_, bytes);
  for (const auto& c : communicators_) c->expect_buffers_up_to(largest_buffer_);
}

comm::WorkPtr ProcessGroup::start(Collective collective, const Tensor& buffer, const Tensor& staging, DType wire) {
  const auto [communicator, direct] = communicator_for(buffer.device());
  // Nothing here waits for the device: the communicator reads the buffer, or its copy into the staging,
  // once the device has passed the point recorded after the ops that wrote it, while this thread queues the
  // next ones (the rest of the backward pass).
  DeviceEventPtr ready = direct ? ops::record_event(buffer.device()) : ops::copy_to_host_async(buffer, staging);
  const Tensor& exchanged = direct ? buffer : staging;
  // The buffer owns a reference to the storage: a collective still running after a failed wait writes
  // into memory that is still there.
  const comm::Buffer data{exchanged.device_pointer(), static_cast<std::size_t>(exchanged.numel()), DType::Float32,
                          exchanged.device(), std::make_shared<const Tensor>(exchanged), wire, std::move(ready)};
  switch (collective) {
    case Collective::Allreduce: return communicator->allreduce(data, comm::ReduceOp::Sum);
    case Collective::Broadcast: return communicator->broadcast(data, 0);
    case Collective::ReduceScatter: return communicator->reduce_scatter(data, comm::ReduceOp::Sum);
    case Collective::Allgather: {
      comm::Buffer mine = data;
      mine.count = data.count / static_cast<std::size_t>(communicator->size());
      mine.data = static_cast<float*>(data.data) + static_cast<std::size_t>(communicator->rank()) * mine.count;
      return communicator->allgather(mine, data);
    }
  }
  throw Error("unknown collective");
}

Tensor ProcessGroup::scratch_staging(std::int64_t elements) {
  if (!scratch_.defined() || scratch_.numel() < elements) scratch_ = Tensor::pinned({elements});
  return scratch_.slice(0, elements);
}

void ProcessGroup::broadcast_from_chief(const std::vector<nn::VariablePtr>& variables) {
  for (const auto& v : variables) {
    const std::int64_t n = v->value.numel();
    const Tensor value = v->value.view({n});
    const bool via_host = staged(value.device());
    const Tensor staging = via_host ? scratch_staging(n) : Tensor();
    start(Collective::Broadcast, value, staging)->wait(timeout());
    if (via_host) ops::copy(staging, value);
  }
}

void ProcessGroup::sum(const Tensor& values) {
  const std::int64_t n = values.numel();
  const Tensor flat = values.view({n});
  const bool via_host = staged(values.device());
  const Tensor staging = via_host ? scratch_staging(n) : Tensor();
  start(Collective::Allreduce, flat, staging)->wait(timeout());
  if (via_host) ops::copy(staging, flat);
}

}  // namespace cohort::train
