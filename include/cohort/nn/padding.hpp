#pragma once
// Keras/TensorFlow padding rules for windowed layers.
//   Valid: out = floor((in - window) / stride) + 1, no padding.
//   Same:  out = ceil(in / stride); the padding is split with the odd element at the bottom/right.

#include <cstdint>

namespace cohort::nn {

enum class Padding { Valid, Same };

struct PaddedExtent {
  std::int64_t out;
  std::int64_t pad_before;
};

// Throws InvalidArgument when the window does not fit a valid convolution.
PaddedExtent padded_extent(std::int64_t in, std::int64_t window, std::int64_t stride, Padding padding);

}  // namespace cohort::nn
