#pragma once
// How a model's gradients are cut into buckets for an overlapped allreduce, DDP-style: variables in
// reverse creation order (the order backward makes them final), a bucket closed once it reaches its
// size, the first one smaller so that communication starts early. A variable larger than a bucket is a
// bucket of its own. Offsets are in elements of one flat buffer, the buckets one after the other; there
// is always at least one bucket. Each variable starts at a multiple of `slot_alignment` elements (16: 64
// bytes, as aligned as a tensor allocated alone, for gradients that view their slots). With `length_multiple`
// each bucket's length is rounded up to a multiple of it (zeros after its variables), so that it cuts into
// that many equal blocks (sharded updates, which keep the slots unpadded so that the blocks share the
// variables' elements evenly).

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "cohort/nn/variable.hpp"

namespace cohort::train {

struct GradientBucket {
  std::int64_t begin = 0, end = 0;   // elements of the flat buffer
  std::vector<std::size_t> members;  // indices into GradientBuckets::variables()
};

class GradientBuckets {
 public:
  GradientBuckets() = default;
  GradientBuckets(const std::vector<nn::VariablePtr>& trainable, std::size_t first_bucket_bytes, std::size_t bucket_bytes,
                  std::int64_t length_multiple = 1, std::int64_t slot_alignment = 1);

  const std::vector<GradientBucket>& buckets() const { return buckets_; }
  // In buffer order (reverse creation order).
  const std::vector<nn::VariablePtr>& variables() const { return variables_; }
  std::int64_t elements() const { return buckets_.empty() ? 0 : buckets_.back().end; }

  struct Slot {
    std::size_t bucket;
    std::int64_t offset;  // in the flat buffer
    std::size_t index;    // into variables()
  };
  // Where `variable` lives; InvalidArgument for a variable the plan was not made for.
  Slot slot_of(const nn::Variable& variable) const;

 private:
  std::vector<nn::VariablePtr> variables_;
  std::vector<GradientBucket> buckets_;
  std::unordered_map<const nn::Variable*, Slot> slots_;
};

}  // namespace cohort::train
