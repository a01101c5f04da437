#include "cohort/nn/padding.hpp"

#include <algorithm>

#include "cohort/core/check.hpp"

namespace cohort::nn {

PaddedExtent padded_extent(std::int64_t in, std::int64_t window, std::int64_t stride, Padding padding) {
  COHORT_CHECK(window > 0 && stride > 0, "window {} and stride {} must be positive", window, stride);
  if (padding == Padding::Valid) {
    COHORT_CHECK(in >= window, "a window of {} does not fit an input of {} with valid padding", window, in);
    return {(in - window) / stride + 1, 0};
  }
  COHORT_CHECK(in > 0, "input extent must be positive, got {}", in);
  const std::int64_t out = (in + stride - 1) / stride;
  const std::int64_t total = std::max<std::int64_t>((out - 1) * stride + window - in, 0);
  return {out, total / 2};
}

}  // namespace cohort::nn
