#include "cohort/train/bucketed_synchronizer.hpp"

#include <algorithm>
#include <chrono>

#include "cohort/core/check.hpp"
#include "cohort/core/timeline.hpp"
#include "cohort/tensor/ops.hpp"
#include "train/replica_statistics.hpp"

namespace cohort::train {
namespace {

// Elements: 64 bytes, where a tensor allocated alone starts.
constexpr std::int64_t kAlignedSlot = 16;

}  // namespace

BucketedSynchronizer::BucketedSynchronizer(ProcessGroup& group, BucketSizes sizes, std::int64_t blocks, bool count_apart)
    : group_(group),
      statistics_(std::make_unique<ReplicaStatistics>(group)),
      sizes_(sizes),
      blocks_(blocks),
      count_apart_(count_apart) {}

void BucketedSynchronizer::plan(const nn::Sequential& model) {
  buckets_ = GradientBuckets(model.trainable_variables(), sizes_.first_bucket_bytes, sizes_.bucket_bytes, blocks_,
                             blocks_ == 1 ? kAlignedSlot : 1);
  bucket_states_.assign(buckets_.buckets().size(), {});
  fused_ = Tensor({buckets_.elements() + 1}, model.device());
  staged_ = group_.staged(model.device());
  staging_ = staged_ ? Tensor::pinned({fused_.numel()}) : Tensor();
  gradient_elements_ = 0;
  for (const auto& v : buckets_.variables()) {
    view_slot(*v, buckets_.slot_of(*v).offset);
    gradient_elements_ += v->gradient.numel();
  }
  std::uint64_t largest = 0;  // the last bucket carries the count
  for (const auto& bucket : buckets_.buckets())
    largest = std::max(largest, static_cast<std::uint64_t>(bucket.end - bucket.begin + 1) * sizeof(float));
  group_.expect_buffers_up_to(largest);
  planned();
}

void BucketedSynchronizer::view_slot(nn::Variable& variable, std::int64_t offset) {
  const Tensor slot = fused_.slice(offset, offset + variable.gradient.numel()).view(variable.gradient.shape());
  ops::copy(variable.gradient, slot);
  variable.gradient = slot;
}

std::vector<std::vector<std::string>> BucketedSynchronizer::bucket_plan() const {
  std::vector<std::vector<std::string>> plan;
  for (const auto& bucket : buckets_.buckets()) {
    plan.emplace_back();
    for (std::size_t member : bucket.members) plan.back().push_back(buckets_.variables()[member]->name);
  }
  return plan;
}

BucketedSynchronizer::~BucketedSynchronizer() = default;

void BucketedSynchronizer::prepare(const nn::Sequential& model) {
  plan(model);
  statistics_->prepare(model);
}

void BucketedSynchronizer::begin(nn::Sequential& model, std::int64_t samples) {
  // The last forward pass of the step has moved the statistics: their sum travels while backward runs.
  statistics_->start(model);
  const auto& trainable = model.trainable_variables();
  const bool same_variables =
      fused_.defined() && fused_.device() == model.device() && buckets_.variables().size() == trainable.size() &&
      std::all_of(trainable.begin(), trainable.end(), [&](const auto& v) { return v->gradient.shares_storage_with(fused_); });
  if (!same_variables) plan(model);
  for (std::size_t b = 0; b < bucket_states_.size(); ++b)
    bucket_states_[b] = {.waiting = buckets_.buckets()[b].members.size(), .work = nullptr};
  count_work_ = nullptr;
  announced_.assign(buckets_.variables().size(), false);
  next_bucket_ = 0;
  step_begun_ = true;
  step_samples_ = static_cast<float>(samples);
  ops::fill(fused_.slice(buckets_.elements(), buckets_.elements() + 1), step_samples_);
  start_ready_buckets();
}

void BucketedSynchronizer::finish(nn::Sequential& model, optim::Optimizer& optimizer) {
  update(model, optimizer, loss_scale_);
  statistics_->finish();
}

void BucketedSynchronizer::gradients_ready(std::span<const nn::VariablePtr> variables) {
  COHORT_CHECK(step_begun_, "gradients_ready() before begin()");
  for (const auto& v : variables) {
    const auto slot = buckets_.slot_of(*v);
    COHORT_CHECK(!announced_[slot.index], "the gradient of '{}' was announced twice in one step", v->name);
    announced_[slot.index] = true;
    // A gradient the caller replaced since begin() goes back into its slot.
    if (!v->gradient.shares_storage_with(fused_)) view_slot(*v, slot.offset);
    ops::scale(v->gradient, step_samples_);
    --bucket_states_[slot.bucket].waiting;
  }
  start_ready_buckets();
}

void BucketedSynchronizer::start_ready_buckets() {
  const auto& buckets = buckets_.buckets();
  while (next_bucket_ < buckets.size() && bucket_states_[next_bucket_].waiting == 0) {
    const bool last = next_bucket_ + 1 == buckets.size();
    const std::int64_t begin = buckets[next_bucket_].begin;
    const std::int64_t end = buckets[next_bucket_].end + (last && !count_apart_ ? 1 : 0);
    bucket_states_[next_bucket_].work = start_bucket(fused_.slice(begin, end), staging_of(begin, end));
    if (last && count_apart_) {
      const std::int64_t count = buckets_.elements();
      count_work_ = group_.start(ProcessGroup::Collective::Allreduce, fused_.slice(count, count + 1), staging_of(count, count + 1));
    }
    ++next_bucket_;
  }
}

double BucketedSynchronizer::wait_for_buckets(std::int64_t staged_from) {
  COHORT_CHECK(step_begun_, "finish() before begin()");
  // None announced: a loop of the caller's own, in which every gradient is final now. Some: a gradient that
  // backward never made final would travel as last step's.
  const auto announced = static_cast<std::size_t>(std::count(announced_.begin(), announced_.end(), true));
  if (announced == 0) gradients_ready(buckets_.variables());
  COHORT_CHECK(announced == 0 || announced == announced_.size(),
               "finish() before every gradient was announced ({} of {} variables)", announced, announced_.size());
  step_begun_ = false;
  {
    const timeline::Span span("communication", "wait for allreduce");
    const auto waited_from = std::chrono::steady_clock::now();
    const auto timeout = group_.timeout();
    for (const BucketState& state : bucket_states_)
      if (state.work) state.work->wait(timeout);
    if (count_work_) count_work_->wait(timeout);
    add_exposed(std::chrono::duration<double>(std::chrono::steady_clock::now() - waited_from).count());
  }
  if (staged_) ops::copy(staging_.slice(staged_from, staging_.numel()), fused_.slice(staged_from, fused_.numel()));
  const double global_samples = ops::sum(fused_.slice(buckets_.elements(), buckets_.elements() + 1));
  COHORT_CHECK(global_samples > 0, "a step in which no process had any data");
  traffic_.gradient_bytes += static_cast<double>(gradient_elements_) * sizeof(float);
  return global_samples;
}

}  // namespace cohort::train
