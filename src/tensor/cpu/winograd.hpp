#pragma once
// Winograd F(2x2, 3x3) and F(4x4, 3x3) convolution for the CPU backend (see winograd.cpp).

#include <string_view>
#include <vector>

#include "cohort/tensor/ops.hpp"

namespace cohort::cpu {

// The instruction sets the Winograd kernels are compiled for (AVX2 and AVX-512 on x86-64 builds).
enum class WinogradIsa { Portable, Avx2, Avx512 };
// "portable", "avx2" or "avx512".
std::string_view winograd_isa_name(WinogradIsa isa);
// Those this build has and this processor runs, the best last.
std::vector<WinogradIsa> usable_winograd_isas();
// The set whose kernels run: the best usable unless COHORT_CPU_ISA names another (InvalidArgument when
// it is not usable here).
WinogradIsa winograd_isa();
// Runs `isa`'s kernels from now on (tests force the AVX2 kernels on an AVX-512 processor). InvalidArgument
// when it is not usable here.
void set_winograd_isa(WinogradIsa isa);

// The output tile size of the Winograd path for a convolution: 0 when it does not apply (not a stride-1
// 3x3 kernel, or too few channels for its GEMMs to run efficiently), else 2 or 4, whichever does fewer
// multiplications over the output's tiles (4 does 2.25 per output and channel pair instead of 4, but
// wastes more on small images whose size it does not divide).
int winograd_tile(const Conv2dGeometry& g);

// Whether a batch has enough tiles to repay the kernel's transform, which costs the same for one image as
// for many: small batches (one image at inference) compute faster through im2col.
bool winograd_repays_kernel_transform(const Conv2dGeometry& g, int tile);

// y = conv(x, kernel) (+ bias when not null, then clipped at zero when `relu`) over NHWC x and HWIO kernel,
// for stride-1 3x3 geometries, with output tiles of `tile` (2 or 4) pixels a side.
void winograd_conv3x3(int tile, const float* x, const float* kernel, const float* bias, bool relu, float* y,
                      const Conv2dGeometry& g);

// Whether direct_conv3x3 computes `g` on this processor: a stride-1 3x3 convolution of few input channels (a
// first layer's RGB), with an instruction set that has the kernel (AVX2 and up).
bool direct_conv3x3_fits(const Conv2dGeometry& g);
// The same y as winograd_conv3x3, from the input rows directly, where direct_conv3x3_fits(g).
void direct_conv3x3(const float* x, const float* kernel, const float* bias, bool relu, float* y, const Conv2dGeometry& g);
// Its kernel gradient (overwrites dkernel), where direct_conv3x3_fits(g).
void direct_conv3x3_kernel_gradient(const float* x, const float* dy, float* dkernel, const Conv2dGeometry& g);

// dkernel = the kernel gradient of a stride-1 3x3 convolution: G^T (sum over tiles of V .* (A dy A^T)) G,
// one GEMM per transformed position over the tiles instead of the im2col product.
void winograd_conv3x3_kernel_gradient(int tile, const float* x, const float* dy, float* dkernel, const Conv2dGeometry& g);

// dx = the data gradient of a stride-1 3x3 convolution, computed as a Winograd convolution of dy with
// the kernel rotated by 180 degrees and its channel axes swapped (with the tile that suits dx).
void winograd_conv3x3_data_gradient(const float* dy, const float* kernel, float* dx, const Conv2dGeometry& g);

}  // namespace cohort::cpu
