#include "train/replica_statistics.hpp"

#include <utility>

#include "cohort/tensor/ops.hpp"

namespace cohort::train {

void ReplicaStatistics::prepare(const nn::Sequential& model) {
  variables_.clear();
  std::int64_t elements = 0;
  if (group_.size() > 1)
    for (const auto& v : model.variables())
      if (!v->trainable) {
        variables_.push_back(v);
        elements += v->value.numel();
      }
  sums_ = elements > 0 ? Tensor({elements}, model.device()) : Tensor();
  staging_ = elements > 0 && group_.staged(model.device()) ? Tensor::pinned({elements}) : Tensor();
  group_.expect_buffers_up_to(static_cast<std::uint64_t>(elements) * sizeof(float));
  planned_ = true;
}

void ReplicaStatistics::start(const nn::Sequential& model) {
  if (!planned_ || (sums_.defined() && sums_.device() != model.device())) prepare(model);
  if (variables_.empty()) return;
  std::int64_t offset = 0;
  for (const auto& v : variables_) {
    const std::int64_t n = v->value.numel();
    ops::copy(v->value.view({n}), sums_.slice(offset, offset + n));
    offset += n;
  }
  work_ = group_.start(ProcessGroup::Collective::Allreduce, sums_, staging_);
}

void ReplicaStatistics::finish() {
  if (!work_) return;
  std::exchange(work_, nullptr)->wait(group_.timeout());
  if (staging_.defined()) ops::copy(staging_, sums_);
  ops::scale(sums_, 1.0f / static_cast<float>(group_.size()));
  std::int64_t offset = 0;
  for (const auto& v : variables_) {
    const std::int64_t n = v->value.numel();
    ops::copy(sums_.slice(offset, offset + n), v->value.view({n}));
    offset += n;
  }
}

}  // namespace cohort::train
