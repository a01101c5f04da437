#pragma once
// The Winograd convolution's kernels and the direct kernel for few input channels (winograd_kernels.cpp),
// compiled once per instruction set, and what they share with the choice among them (winograd.cpp).
#include <cstdint>

#include "cohort/tensor/geometry.hpp"

namespace cohort::cpu {

struct WinogradKernels {
  // y = conv(x) + bias, clipped at zero (ReLU) when `relu`.
  void (*forward)(int tile, const float* x, const float* kernel, const float* bias, bool relu, float* y,
                  const Conv2dGeometry& g);
  void (*kernel_gradient)(int tile, const float* x, const float* dy, float* dkernel, const Conv2dGeometry& g);
  // The same y for a stride-1 3x3 convolution of at most kDirectMaxChannels input channels, computed
  // directly from the input rows (no im2col copy, no GEMM packing); null where the instruction set has no
  // kernel for it (then im2col runs).
  void (*direct_forward)(const float* x, const float* kernel, const float* bias, bool relu, float* y,
                         const Conv2dGeometry& g);
  // Its kernel gradient (overwrites dkernel); null with direct_forward.
  void (*direct_kernel_gradient)(const float* x, const float* dy, float* dkernel, const Conv2dGeometry& g);
};

// A direct kernel's depth (9 x channels) fits its register-blocked products.
constexpr std::int64_t kDirectMaxChannels = 7;

const WinogradKernels& winograd_kernels_portable();
#if COHORT_WINOGRAD_X86_VARIANTS
const WinogradKernels& winograd_kernels_avx2();
const WinogradKernels& winograd_kernels_avx512();
#endif

// Kernel transforms over at least this many channel pairs are spread over the threads.
constexpr std::int64_t kParallelPairs = 4096;

// The output's m x m tiles: per sample and in the whole batch.
struct Tiling {
  std::int64_t tiles_h, tiles_w, per_sample, total;
};

inline Tiling tiling(const Conv2dGeometry& g, int m) {
  const std::int64_t th = (g.out_h + m - 1) / m, tw = (g.out_w + m - 1) / m;
  return {th, tw, th * tw, g.batch * th * tw};
}

}  // namespace cohort::cpu
