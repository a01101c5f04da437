// The Winograd path's choices: the tile per layer, whether a batch repays the kernel transform, and the
// instruction set whose compiled kernels run (the best the processor has, unless COHORT_CPU_ISA or
// set_winograd_isa() chose).
#include "winograd.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "cohort/core/check.hpp"
#include "winograd_kernels.hpp"
#if COHORT_WINOGRAD_X86_VARIANTS
#include "avx512_passes.hpp"
#endif

namespace cohort::cpu {
namespace {

// Below this many tiles in a batch, im2col is faster (measured with cohort_layer_profile at batches 1 to 8, on
// 1 and 2 threads of an AVX-512 Xeon: 64 cost one image's 32x32 -> 30x30 layer 0.24 ms where im2col, a
// sample's pixels shared among the threads, took 0.21 on one thread and 0.11 on two; 260 was slower at 4).
constexpr std::int64_t kMinTilesPerBatch = 130;

constexpr int kUnchosen = -1;
std::atomic<int> chosen_isa{kUnchosen};
std::once_flag first_choice;

bool processor_has(WinogradIsa isa) {
#if COHORT_WINOGRAD_X86_VARIANTS
  if (isa == WinogradIsa::Avx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (isa == WinogradIsa::Avx512)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512bw");
#endif
  return isa == WinogradIsa::Portable;
}

const WinogradKernels& kernels() {
#if COHORT_WINOGRAD_X86_VARIANTS
  switch (winograd_isa()) {
    case WinogradIsa::Avx512: return winograd_kernels_avx512();
    case WinogradIsa::Avx2: return winograd_kernels_avx2();
    case WinogradIsa::Portable: break;
  }
#endif
  return winograd_kernels_portable();
}

}  // namespace

std::string_view winograd_isa_name(WinogradIsa isa) {
  switch (isa) {
    case WinogradIsa::Avx512: return "avx512";
    case WinogradIsa::Avx2: return "avx2";
    case WinogradIsa::Portable: break;
  }
  return "portable";
}

std::vector<WinogradIsa> usable_winograd_isas() {
  std::vector<WinogradIsa> usable;
  for (WinogradIsa isa : {WinogradIsa::Portable, WinogradIsa::Avx2, WinogradIsa::Avx512})
    if (processor_has(isa)) usable.push_back(isa);
  return usable;
}

WinogradIsa winograd_isa() {
  if (const int isa = chosen_isa.load(std::memory_order_acquire); isa != kUnchosen) return static_cast<WinogradIsa>(isa);
  std::call_once(first_choice, [] {
    const std::vector<WinogradIsa> usable = usable_winograd_isas();
    WinogradIsa isa = usable.back();
    if (const char* name = std::getenv("COHORT_CPU_ISA"); name != nullptr && *name != '\0') {
      const auto named = std::find_if(usable.begin(), usable.end(), [&](WinogradIsa i) { return winograd_isa_name(i) == name; });
      if (named == usable.end()) {
        std::string names;
        for (WinogradIsa i : usable) names += (names.empty() ? "" : ", ") + std::string(winograd_isa_name(i));
        throw InvalidArgument(fmt::format("COHORT_CPU_ISA={}: this processor and build run {}", name, names));
      }
      isa = *named;
    }
    int expected = kUnchosen;
    chosen_isa.compare_exchange_strong(expected, static_cast<int>(isa));
  });
  return static_cast<WinogradIsa>(chosen_isa.load(std::memory_order_acquire));
}

void set_winograd_isa(WinogradIsa isa) {
  COHORT_CHECK(processor_has(isa), "this processor or build cannot run the {} Winograd kernels", winograd_isa_name(isa));
  chosen_isa.store(static_cast<int>(isa), std::memory_order_release);
}

#if COHORT_WINOGRAD_X86_VARIANTS
bool avx512::run_for(std::int64_t channels) { return channels % kLanes == 0 && winograd_isa() == WinogradIsa::Avx512; }
#endif

int winograd_tile(const Conv2dGeometry& g) {
  if (g.kernel_h != 3 || g.kernel_w != 3 || g.stride_h != 1 || g.stride_w != 1 || g.in_c < 8 || g.out_c < 8) return 0;
  // Multiplications per sample and channel pair: a^2 for every tile. The larger tile's transforms cost
  // more per multiplication saved, hence its margin.
  const double small = 16.0 * static_cast<double>(tiling(g, 2).per_sample);
  const double large = 36.0 * static_cast<double>(tiling(g, 4).per_sample);
  return large <= 0.8 * small ? 4 : 2;
}

bool winograd_repays_kernel_transform(const Conv2dGeometry& g, int tile) {
  return tiling(g, tile).total >= kMinTilesPerBatch;
}

void winograd_conv3x3(int tile, const float* x, const float* kernel, const float* bias, bool relu, float* y,
                      const Conv2dGeometry& g) {
  kernels().forward(tile, x, kernel, bias, relu, y, g);
}

bool direct_conv3x3_fits(const Conv2dGeometry& g) {
  return g.kernel_h == 3 && g.kernel_w == 3 && g.stride_h == 1 && g.stride_w == 1 && g.in_c <= kDirectMaxChannels &&
         kernels().direct_forward != nullptr;
}

void direct_conv3x3(const float* x, const float* kernel, const float* bias, bool relu, float* y, const Conv2dGeometry& g) {
  kernels().direct_forward(x, kernel, bias, relu, y, g);
}

void direct_conv3x3_kernel_gradient(const float* x, const float* dy, float* dkernel, const Conv2dGeometry& g) {
  kernels().direct_kernel_gradient(x, dy, dkernel, g);
}

void winograd_conv3x3_kernel_gradient(int tile, const float* x, const float* dy, float* dkernel, const Conv2dGeometry& g) {
  kernels().kernel_gradient(tile, x, dy, dkernel, g);
}

void winograd_conv3x3_data_gradient(const float* dy, const float* kernel, float* dx, const Conv2dGeometry& g) {
  // dx[h, w, c] = sum over (i, j, f) of dy[h + pad_top - i, w + pad_left - j, f] * kernel[i, j, c, f]: a
  // convolution of dy with kernel'[i', j', f, c] = kernel[2 - i', 2 - j', c, f] and padding 2 - pad.
  std::vector<float> rotated(static_cast<std::size_t>(9 * g.in_c * g.out_c));
#pragma omp parallel for schedule(static) if (g.in_c * g.out_c >= kParallelPairs)
  for (std::int64_t c = 0; c < g.in_c; ++c)
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j)
        for (std::int64_t f = 0; f < g.out_c; ++f)
          rotated[static_cast<std::size_t>(((i * 3 + j) * g.out_c + f) * g.in_c + c)] =
              kernel[(((2 - i) * 3 + (2 - j)) * g.in_c + c) * g.out_c + f];
  const Conv2dGeometry adjoint{g.batch, g.out_h, g.out_w, g.out_c, g.in_h, g.in_w, g.in_c, 3, 3, 1, 1,
                               2 - g.pad_top, 2 - g.pad_left};
  winograd_conv3x3(winograd_tile(adjoint), dy, rotated.data(), nullptr, false, dx, adjoint);
}

}  // namespace cohort::cpu
