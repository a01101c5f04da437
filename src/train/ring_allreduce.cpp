#include "cohort/train/ring_allreduce.hpp"

#include <algorithm>

#include "cohort/comm/nccl.hpp"
#include "cohort/core/check.hpp"
#include "cohort/core/logging.hpp"
#include "cohort/tensor/devices.hpp"
#include "cohort/tensor/ops.hpp"
#include "cohort/train/update.hpp"

namespace cohort::train {

RingAllreduce::RingAllreduce(comm::Transport& transport, RingAllreduceOptions options)
    : RingAllreduce(std::shared_ptr<comm::Communicator>(comm::make_ring_communicator(transport)), options) {}

RingAllreduce::RingAllreduce(std::shared_ptr<comm::Communicator> communicator, RingAllreduceOptions options)
    : RingAllreduce(std::vector{std::move(communicator)}, options) {}

RingAllreduce::RingAllreduce(std::vector<std::shared_ptr<comm::Communicator>> communicators, RingAllreduceOptions options)
    : options_(options), communicators_(std::move(communicators)) {
  COHORT_CHECK(!communicators_.empty(), "RingAllreduce needs a communicator");
  for (const auto& c : communicators_) {
    COHORT_CHECK(c != nullptr, "RingAllreduce got a null communicator");
    COHORT_CHECK(c->rank() == communicators_[0]->rank() && c->size() == communicators_[0]->size(),
                 "communicators '{}' (rank {} of {}) and '{}' (rank {} of {}) span different groups", c->name(),
                 c->rank(), c->size(), communicators_[0]->name(), communicators_[0]->rank(), communicators_[0]->size());
  }
}

std::string RingAllreduce::name() const {
  const std::string& first = communicators_.front()->name();
  return first == "ring" ? "ring-allreduce" : "allreduce over " + first;
}

void RingAllreduce::run_collective(const Tensor& buffer, bool broadcast) {
  comm::Communicator* communicator = communicators_.front().get();
  for (const auto& c : communicators_)
    if (c->accepts(buffer.device())) {
      communicator = c.get();
      break;
    }
  const bool direct = communicator->accepts(buffer.device());
  if (!direct) {
    if (!staging_.defined() || staging_.numel() < buffer.numel()) staging_ = Tensor::pinned({buffer.numel()});
    ops::copy(buffer, staging_.slice(0, buffer.numel()));
  }
  // A communicator with a stream of its own reads the buffer only after the ops that wrote it.
  if (direct) ops::synchronize(buffer.device());
  const Tensor& exchanged = direct ? buffer : staging_;
  // The buffer owns a reference to the storage: a collective still running after a failed wait writes
  // into memory that is still there.
  const comm::Buffer data{exchanged.device_pointer(), static_cast<std::size_t>(buffer.numel()), comm::DataType::Float32,
                          exchanged.device(), std::make_shared<const Tensor>(exchanged)};
  auto work = broadcast ? communicator->broadcast(data, 0) : communicator->allreduce(data, comm::ReduceOp::Sum);
  work->wait(communicator->timeout());
  if (!direct) ops::copy(staging_.slice(0, buffer.numel()), buffer);
}

void RingAllreduce::add_gpu_communicator(Device device) {
  if (!comm::nccl_available()) return;
  comm::Communicator* host = nullptr;
  for (const auto& c : communicators_) {
    if (c->accepts(Device::CUDA)) return;  // the caller chose one
    if (host == nullptr && c->accepts(Device::CPU)) host = c.get();
  }
  if (host == nullptr) return;
  // Collective: every rank says whether and where it uses a GPU, and all reach the same verdict.
  std::string why_not;
  auto nccl = comm::make_nccl_communicator(*host, device == Device::CUDA ? cuda_device_index() : -1, why_not);
  if (nccl) {
    communicators_.insert(communicators_.begin(), std::shared_ptr<comm::Communicator>(std::move(nccl)));
    if (is_chief()) log::info("gradients travel over NCCL, from GPU to GPU");
  } else if (device == Device::CUDA && is_chief()) {
    log::info("gradients travel through pinned host memory over {}: {}", host->name(), why_not);
  }
}

void RingAllreduce::initialize(nn::Sequential& model, optim::Optimizer&) {
  add_gpu_communicator(model.device());
  // Every variable, trainable or not, starts from the chief's value.
  for (const auto& v : model.variables()) run_collective(v->value.view({v->value.numel()}), true);
}

void RingAllreduce::apply_gradients(nn::Sequential& model, optim::Optimizer& optimizer, std::int64_t samples) {
  const auto variables = model.trainable_variables();
  std::int64_t total = 0;
  for (const auto& v : variables) total += v->gradient.numel();
  if (!fused_.defined() || fused_.numel() != total + 1 || fused_.device() != model.device())
    fused_ = Tensor({total + 1}, model.device());
  // Each process's mean gradient times its sample count, summed, over the summed counts: the gradient
  // of the mean loss over the whole global batch, however unevenly it was shared.
  const auto weight = static_cast<float>(samples);
  std::int64_t at = 0;
  for (const auto& v : variables) {
    const std::int64_t n = v->gradient.numel();
    ops::copy(v->gradient.view({n}), fused_.slice(at, at + n));
    at += n;
  }
  const Tensor gradients = fused_.slice(0, total), sample_count = fused_.slice(total, total + 1);
  ops::scale(gradients, weight);
  ops::fill(sample_count, weight);
  run_collective(fused_, false);
  const double global_samples = ops::sum(sample_count);
  COHORT_CHECK(global_samples > 0, "a step in which no process had any data");
  ops::scale(gradients, 1.0f / static_cast<float>(global_samples));
  at = 0;
  for (const auto& v : variables) {
    const std::int64_t n = v->gradient.numel();
    ops::copy(fused_.slice(at, at + n), v->gradient.view({n}));
    at += n;
  }
  update_variables(optimizer, variables);
}

bool RingAllreduce::sum_over_replicas(std::span<double> values) {
  const auto host = std::find_if(communicators_.begin(), communicators_.end(),
                                 [](const auto& c) { return c->accepts(Device::CPU); });
  COHORT_CHECK(host != communicators_.end(), "none of the communicators takes host memory");
  comm::Communicator& communicator = **host;
  // Gathered as raw bytes (a double is two float slots) and added in rank order: exact, and the same
  // on every rank, which a float reduction would be neither.
  const auto ranks = static_cast<std::size_t>(communicator.size());
  auto mine = std::make_shared<std::vector<double>>(values.begin(), values.end());
  auto all = std::make_shared<std::vector<double>>(values.size() * ranks);
  const std::size_t slots = values.size() * sizeof(double) / sizeof(float);
  const comm::Buffer mine_buffer{mine->data(), slots, comm::DataType::Float32, Device::CPU, mine};
  const comm::Buffer all_buffer{all->data(), slots * ranks, comm::DataType::Float32, Device::CPU, all};
  communicator.allgather(mine_buffer, all_buffer)->wait(communicator.timeout());
  for (std::size_t i = 0; i < values.size(); ++i) {
    double sum = 0;
    for (std::size_t r = 0; r < ranks; ++r) sum += (*all)[r * values.size() + i];
    values[i] = sum;
  }
  return true;
}

DataShare RingAllreduce::data_share() const {
  return data_share_for(options_.data, communicators_.front()->rank(), communicators_.front()->size());
}

}  // namespace cohort::train
