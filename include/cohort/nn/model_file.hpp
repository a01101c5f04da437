#pragma once
// Model files: the architecture (each layer's type, name and config), the weights and the input
// normalization in one versioned, checksummed file written atomically, from which load_model builds a
// ready Sequential in a program that does not have the model's code. Built-in layers only: a model with
// a user-defined layer is refused at save time, naming it (its weights can still be saved).
//
//   nn::save_model(model, "fashion.model", {.input_mean = stats.mean, .input_stddev = stats.stddev});
//   nn::Sequential served = nn::load_model("fashion.model");     // elsewhere
//   Tensor probabilities = served.forward(raw_images);            // normalization included

#include <filesystem>
#include <vector>

#include "cohort/nn/sequential.hpp"

namespace cohort::nn {

struct SaveModelOptions {
  // The per-channel normalization the training data went through (data::normalize), if any: saved as a
  // first Normalization layer, so that the loaded model takes raw inputs.
  std::vector<float> input_mean, input_stddev;
};

void save_model(const Sequential& model, const std::filesystem::path& path, const SaveModelOptions& options = {});
// A model in inference mode on `device`; DataError for a damaged, foreign or unknown file.
Sequential load_model(const std::filesystem::path& path, Device device = Device::CPU);

}  // namespace cohort::nn
