#pragma once
// Dropout's draw, for the CPU loops and the CUDA kernel alike: element i of a mask is 0 when the 53-bit
// uniform mix64(mix64(seed) ^ i) >> 11 falls below rate * 2^53, else 1 / (1 - rate). A mask depends on
// (seed, i) alone: not on threads, blocks or the device.
#include <cstdint>

#include "cohort/core/seed.hpp"
#include "tensor/host_device.hpp"

namespace cohort {

struct DropoutRule {
  std::uint64_t key, threshold;
  float keep_scale;

  static DropoutRule of(float rate, std::uint64_t seed) {
    return {key_of(seed), static_cast<std::uint64_t>(static_cast<double>(rate) * 9007199254740992.0),
            1.0f / (1.0f - rate)};
  }
  // The key of a mask's seed, for a kernel that reads its step on the device (derive_seed(seed, step)).
  COHORT_HOST_DEVICE static std::uint64_t key_of(std::uint64_t seed) { return mix64(seed); }
  COHORT_HOST_DEVICE float operator()(std::uint64_t i) const {
    return (mix64(key ^ i) >> 11) < threshold ? 0.0f : keep_scale;
  }
};

}  // namespace cohort
