#pragma once
// Per-sample transforms applied by the DataLoader after load(): augmentation and normalization.
// A transform gets the sample (HWC floats), its shape, and a random stream that is a pure function of
// the loader seed, the epoch and the sample index, so augmentation is reproducible under any threading.
//
//   loader_options.transforms = {data::random_crop(4), data::random_flip_horizontal(),
//                                data::normalize(mean, stddev)};

#include <functional>
#include <random>
#include <span>
#include <vector>

#include "cohort/data/dataset.hpp"

namespace cohort::data {

using Transform = std::function<void(std::span<float> sample, const Shape& shape, std::mt19937_64& rng)>;

// Zero-pads by `padding` on every side and crops back to the original size at a random offset.
Transform random_crop(int padding);
// Mirrors the image left-right with probability 1/2.
Transform random_flip_horizontal();
// (x - mean[c]) / stddev[c] per channel.
Transform normalize(std::vector<float> mean, std::vector<float> stddev);

struct ChannelStatistics {
  std::vector<float> mean, stddev;
};
// Per-channel mean and standard deviation over (at most `max_samples` evenly spaced samples of) a set.
ChannelStatistics channel_statistics(const Dataset& dataset, std::int64_t max_samples = 10000);

}  // namespace cohort::data
