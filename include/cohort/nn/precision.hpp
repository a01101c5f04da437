#pragma once
// A model's precision policy, with Keras' names. Under a mixed policy the variables stay float32 (the master
// copy that optimizers update and files save) while the layers compute in the policy's 16-bit type, each
// with its variables converted to that type for the step; batch normalization keeps float32 statistics, and
// the model's output is float32, its final softmax or sigmoid computed in float32, as Keras recommends.
//
//   model.set_precision(nn::parse_precision("mixed_bfloat16").value());
//   DType compute = nn::compute_dtype(model.precision());   // DType::BFloat16

#include <optional>
#include <string_view>

#include "cohort/core/dtype.hpp"

namespace cohort::nn {

enum class Precision { Float32, MixedBFloat16, MixedFloat16 };

constexpr std::string_view precision_name(Precision precision) {
  switch (precision) {
    case Precision::Float32: return "float32";
    case Precision::MixedBFloat16: return "mixed_bfloat16";
    case Precision::MixedFloat16: return "mixed_float16";
  }
  return "unknown";
}

// "float32", "mixed_bfloat16" or "mixed_float16"; nullopt for anything else.
constexpr std::optional<Precision> parse_precision(std::string_view name) {
  for (Precision precision : {Precision::Float32, Precision::MixedBFloat16, Precision::MixedFloat16})
    if (precision_name(precision) == name) return precision;
  return std::nullopt;
}

// The element type layers compute in.
constexpr DType compute_dtype(Precision precision) {
  switch (precision) {
    case Precision::MixedBFloat16: return DType::BFloat16;
    case Precision::MixedFloat16: return DType::Float16;
    case Precision::Float32: break;
  }
  return DType::Float32;
}

}  // namespace cohort::nn
