#pragma once
// The position in training (and the model's step counter, which seeds dropout) as bytes, for checkpoint
// manifests that keep the trainer's state next to the parameter servers' snapshots.

#include <cstdint>
#include <string>
#include <utility>

#include "cohort/train/checkpoint.hpp"

namespace cohort::train {

std::string encode_position(const TrainingPosition& position, std::uint64_t model_step);
// Throws DataError when the bytes do not decode.
std::pair<TrainingPosition, std::uint64_t> decode_position(const std::string& bytes);

}  // namespace cohort::train
