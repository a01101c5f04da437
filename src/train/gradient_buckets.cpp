#include "cohort/train/gradient_buckets.hpp"

#include <fmt/format.h>

#include "cohort/core/check.hpp"
#include "cohort/core/error.hpp"

namespace cohort::train {

GradientBuckets::GradientBuckets(const std::vector<nn::VariablePtr>& trainable, std::size_t first_bucket_bytes,
                                 std::size_t bucket_bytes, std::int64_t length_multiple, std::int64_t slot_alignment)
    : variables_(trainable.rbegin(), trainable.rend()) {
  COHORT_CHECK(length_multiple >= 1 && slot_alignment >= 1, "gradient buckets: a length multiple of {}, slots aligned to {}",
               length_multiple, slot_alignment);
  std::int64_t at = 0;
  const auto close_last = [&] {
    GradientBucket& last = buckets_.back();
    last.end = last.begin + (last.end - last.begin + length_multiple - 1) / length_multiple * length_multiple;
    at = last.end;
  };
  const auto align = [&] { at = (at + slot_alignment - 1) / slot_alignment * slot_alignment; };
  for (std::size_t i = 0; i < variables_.size(); ++i) {
    const std::size_t limit = buckets_.size() <= 1 ? first_bucket_bytes : bucket_bytes;
    if (buckets_.empty() || static_cast<std::size_t>(buckets_.back().end - buckets_.back().begin) * sizeof(float) >= limit) {
      if (!buckets_.empty()) close_last();
      align();
      buckets_.push_back({at, at, {}});
    }
    GradientBucket& bucket = buckets_.back();
    align();
    slots_[variables_[i].get()] = {buckets_.size() - 1, at, i};
    at += variables_[i]->gradient.numel();
    bucket.end = at;
    bucket.members.push_back(i);
  }
  // The sample count travels at the end of the last bucket: a model without trainable variables has one
  // empty bucket.
  if (buckets_.empty()) buckets_.push_back({});
  close_last();
}

GradientBuckets::Slot GradientBuckets::slot_of(const nn::Variable& variable) const {
  const auto found = slots_.find(&variable);
  if (found == slots_.end())
    throw InvalidArgument(fmt::format("'{}' is not one of the trainable variables the gradient buckets were planned for",
                                      variable.name));
  return found->second;
}

}  // namespace cohort::train
