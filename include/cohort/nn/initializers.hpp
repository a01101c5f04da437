#pragma once
// Weight initializers with Keras semantics. fan_in and fan_out follow Keras: for a kernel of shape
// (..., in, out), receptive field = product of the leading axes.

#include <cstdint>
#include <random>

#include "cohort/tensor/tensor.hpp"

namespace cohort::nn::init {

// Uniform in [-limit, limit] with limit = sqrt(6 / (fan_in + fan_out)).
void glorot_uniform(const Tensor& kernel, std::mt19937_64& rng);
void constant(const Tensor& t, float value);

}  // namespace cohort::nn::init
