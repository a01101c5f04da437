#pragma once
// Winograd F(2x2, 3x3) convolution for the CPU backend (see winograd.cpp).

#include "cohort/tensor/ops.hpp"

namespace cohort::cpu {

// True when the Winograd path is both valid (3x3 kernel, stride 1) and worth it (enough channels for
// its sixteen GEMMs to run efficiently).
bool winograd_applies(const Conv2dGeometry& g);

// y = conv(x, kernel) (+ bias when not null) over NHWC x and HWIO kernel, for stride-1 3x3 geometries.
void winograd_conv3x3(const float* x, const float* kernel, const float* bias, float* y, const Conv2dGeometry& g);

// dkernel = the kernel gradient of a stride-1 3x3 convolution: G^T (sum over tiles of V .* (A dy A^T)) G,
// sixteen GEMMs over the tiles instead of the im2col product.
void winograd_conv3x3_kernel_gradient(const float* x, const float* dy, float* dkernel, const Conv2dGeometry& g);

// dx = the data gradient of a stride-1 3x3 convolution, computed as a Winograd convolution of dy with
// the kernel rotated by 180 degrees and its channel axes swapped.
void winograd_conv3x3_data_gradient(const float* dy, const float* kernel, float* dx, const Conv2dGeometry& g);

}  // namespace cohort::cpu
