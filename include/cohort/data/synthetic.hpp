#pragma once
// A synthetic, learnable image classification set for tests: every class has a random prototype image,
// and each sample is its class prototype plus uniform noise.
//
//   auto set = data::make_synthetic({.samples = 512, .sample_shape = {8, 8, 3}, .classes = 4});

#include <cstdint>

#include "cohort/data/image_dataset.hpp"

namespace cohort::data {

struct SyntheticOptions {
  std::int64_t samples = 1024;
  Shape sample_shape{8, 8, 1};
  int classes = 4;
  int noise = 48;  // maximum absolute deviation from the prototype, in 8-bit units
  std::uint64_t seed = 1;
};

ImageDataset make_synthetic(const SyntheticOptions& options);

}  // namespace cohort::data
