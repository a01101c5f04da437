#pragma once
// Weights files: every variable of a model (trainable or not: batch-norm moving statistics too) by name,
// without optimizer state, for inference or fine-tuning. The file is versioned, checksummed and written
// atomically like the checkpoints; loading a damaged, foreign or mismatched file raises DataError and
// changes nothing.
//
//   nn::save_weights(model, "best.weights");
//   nn::Sequential fresh = build_model();  nn::load_weights(fresh, "best.weights");

#include <filesystem>

#include "cohort/nn/sequential.hpp"

namespace cohort::nn {

void save_weights(const Sequential& model, const std::filesystem::path& path);
// `model` must have the same variables (names and shapes) as the saved one; it may be on any device.
void load_weights(Sequential& model, const std::filesystem::path& path);

}  // namespace cohort::nn
