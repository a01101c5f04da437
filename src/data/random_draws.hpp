#pragma once
// The random choices of random_crop and random_flip_horizontal, taken from a sample's stream. An
// ImageAugmentation's draws come from the same functions, so that a device expanding 8-bit images makes
// the host transforms' choices.
#include <array>
#include <random>

namespace cohort::data {

// (dy, dx): the crop's shift, within `padding` pixels each way.
inline std::array<int, 2> draw_crop_offset(int padding, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> offset(-padding, padding);
  const int dy = offset(rng);
  return {dy, offset(rng)};
}

// Whether the image is mirrored, with probability 1/2.
inline bool draw_flip(std::mt19937_64& rng) { return std::uniform_int_distribution<int>(0, 1)(rng) == 1; }

}  // namespace cohort::data
