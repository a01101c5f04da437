#include "cohort/train/ring_allreduce.hpp"

#include <cstring>

#include "cohort/comm/collectives.hpp"
#include "cohort/core/check.hpp"

namespace cohort::train {

RingAllreduce::RingAllreduce(comm::Transport& transport, RingAllreduceOptions options)
    : transport_(transport), options_(options) {}

void RingAllreduce::initialize(nn::Sequential& model, optim::Optimizer&) {
  // Every variable, trainable or not, starts from the chief's value.
  for (const auto& v : model.variables())
    comm::broadcast(transport_, 0, std::as_writable_bytes(v->value.values()));
}

void RingAllreduce::apply_gradients(nn::Sequential& model, optim::Optimizer& optimizer, std::int64_t samples) {
  const auto variables = model.trainable_variables();
  std::size_t total = 1;
  for (const auto& v : variables) total += static_cast<std::size_t>(v->gradient.numel());
  buffer_.resize(total);
  // Each process's mean gradient times its sample count, summed, over the summed counts: the gradient
  // of the mean loss over the whole global batch, however unevenly it was shared.
  const auto weight = static_cast<float>(samples);
  std::size_t at = 0;
  for (const auto& v : variables) {
    const float* g = v->gradient.data();
    for (std::int64_t i = 0; i < v->gradient.numel(); ++i) buffer_[at++] = g[i] * weight;
  }
  buffer_[at] = weight;
  comm::allreduce(transport_, buffer_);
  const float global_samples = buffer_.back();
  COHORT_CHECK(global_samples > 0, "a step in which no process had any data");
  const float inverse = 1.0f / global_samples;
  at = 0;
  for (const auto& v : variables) {
    float* g = v->gradient.data();
    for (std::int64_t i = 0; i < v->gradient.numel(); ++i) g[i] = buffer_[at++] * inverse;
  }
  optimizer.apply(variables);
}

DataShare RingAllreduce::data_share() const { return data_share_for(options_.data, transport_.rank(), transport_.size()); }

}  // namespace cohort::train
