// 2-D convolution on the CPU: NHWC input, HWIO kernel, lowered to GEMM per chunk of whole samples.
//
// The product of a chunk's im2col matrix (im2col.hpp) col[M x K] and kernel[K x F] is its NHWC output.
// Samples are grouped into chunks of about kRowsPerChunk output pixels so that the col buffer stays in L2
// and each GEMM is large enough to run near peak; chunks are spread over threads. A chunk never splits a
// sample, so the col2im scatter of the data gradient never races. The kernel gradient is summed per thread
// and reduced in thread order, which keeps results bitwise repeatable for a given thread count.
// Stride-1 3x3 convolutions with enough channels take the Winograd path (winograd.cpp) instead.
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "cohort/tensor/gemm_path.hpp"
#include "activation_dispatch.hpp"
#include "cpu_backend.hpp"
#include "im2col.hpp"
#include "onednn.hpp"
#include "scratch.hpp"
#include "tensor/backend_access.hpp"
#include "winograd.hpp"

namespace cohort::cpu {
namespace {

constexpr std::int64_t kRowsPerChunk = 512;

struct Chunking {
  std::int64_t samples_per_chunk;
  std::int64_t chunks;
  bool parallel_over_chunks;  // else one chunk at a time, each GEMM multithreaded
};

Chunking chunking(const Conv2dGeometry& g) {
  const std::int64_t pixels = std::max<std::int64_t>(1, g.out_h * g.out_w);
  const std::int64_t per_chunk = std::clamp<std::int64_t>(kRowsPerChunk / pixels, 1, std::max<std::int64_t>(1, g.batch));
  const std::int64_t chunks = (g.batch + per_chunk - 1) / per_chunk;
  return {per_chunk, chunks, chunks >= omp_get_max_threads()};
}

// Adds the im2col rows of one sample back onto its input gradient (the adjoint of im2col).
void col2im_add(const float* col, const Conv2dGeometry& g, float* dx) {
  const std::int64_t c = g.in_c;
  const std::int64_t row_width = taps(g);
  for (std::int64_t oh = 0; oh < g.out_h; ++oh) {
    for (std::int64_t ow = 0; ow < g.out_w; ++ow) {
      const float* row = col + (oh * g.out_w + ow) * row_width;
      for (std::int64_t kh = 0; kh < g.kernel_h; ++kh) {
        const std::int64_t ih = oh * g.stride_h - g.pad_top + kh;
        if (ih < 0 || ih >= g.in_h) continue;
        for (std::int64_t kw = 0; kw < g.kernel_w; ++kw) {
          const std::int64_t iw = ow * g.stride_w - g.pad_left + kw;
          if (iw < 0 || iw >= g.in_w) continue;
          const float* src = row + (kh * g.kernel_w + kw) * c;
          float* dst = dx + (ih * g.in_w + iw) * c;
#pragma omp simd
          for (std::int64_t i = 0; i < c; ++i) dst[i] += src[i];
        }
      }
    }
  }
}

// Runs body(chunk, col_buffer, thread) for every chunk, on the threads the chunking asks for.
template <typename Body>
void for_each_chunk(const Conv2dGeometry& g, const Chunking& plan, Body&& body) {
  const auto col_floats = static_cast<std::size_t>(plan.samples_per_chunk * g.out_h * g.out_w * taps(g));
  if (!plan.parallel_over_chunks) {
    float* col = thread_scratch(ScratchSlot::Columns, col_floats);
    for (std::int64_t chunk = 0; chunk < plan.chunks; ++chunk) body(chunk, col, 0);
    return;
  }
#pragma omp parallel
  {
    float* col = thread_scratch(ScratchSlot::Columns, col_floats);
    const int thread = omp_get_thread_num();
#pragma omp for schedule(static)
    for (std::int64_t chunk = 0; chunk < plan.chunks; ++chunk) body(chunk, col, thread);
  }
}

// The CPU's algorithm choice for one convolution, made once per layer.
struct ConvPlan : PlanState {
  int winograd_tile = 0;  // 0: im2col
  mutable onednn::Convolution onednn;  // its primitives, made as bfloat16 (or float32) operands come
};

// The plan's Winograd tile where this batch repays the kernel transform, else 0 (im2col).
int winograd_tile_of(const PlanState* plan, const Conv2dGeometry& g) {
  const int tile = static_cast<const ConvPlan*>(plan)->winograd_tile;
  return tile != 0 && winograd_repays_kernel_transform(g, tile) ? tile : 0;
}

}  // namespace

std::shared_ptr<const PlanState> CpuBackend::plan(const Conv2dGeometry& geometry) {
  auto plan = std::make_shared<ConvPlan>();
  plan->winograd_tile = winograd_tile(geometry);
  return plan;
}

void CpuBackend::conv2d_forward(const PlanState* conv_plan, const Conv2dGeometry& g, const Tensor& x,
                                const Tensor& kernel, const Tensor& bias, const Tensor& y) {
  conv2d_forward_activated(conv_plan, g, x, kernel, bias, Activation::Linear, y);
}

void CpuBackend::conv2d_forward_activated(const PlanState* conv_plan, const Conv2dGeometry& g, const Tensor& x,
                                          const Tensor& kernel, const Tensor& bias, Activation activation,
                                          const Tensor& y) {
  if (x.dtype() == DType::BFloat16 || onednn::float32_forward_convolutions())
    return static_cast<const ConvPlan*>(conv_plan)->onednn.forward(g, x, kernel, bias, activation, y);
  gemm_path();  // chosen (or COHORT_GEMM refused) here, not inside the parallel regions that multiply
  const float* bias_data = bias.defined() ? device_data(bias) : nullptr;
  // The Winograd and direct kernels clip at zero as they write; other activations take a pass of their own.
  const bool relu = activation == Activation::Relu;
  const bool separate_activation = !relu && activation != Activation::Linear;
  if (const int tile = winograd_tile_of(conv_plan, g)) {
    winograd_conv3x3(tile, device_data(x), device_data(kernel), bias_data, relu, device_data(y), g);
    if (separate_activation) activation_forward(activation, y, y);
    return;
  }
  if (direct_conv3x3_fits(g)) {
    direct_conv3x3(device_data(x), device_data(kernel), bias_data, relu, device_data(y), g);
    if (separate_activation) activation_forward(activation, y, y);
    return;
  }
  // The output rows (sample-major) in pieces of a chunk's rows, or fewer where the batch has fewer chunks than
  // there are threads (one image at inference): each thread then takes a share of a sample's pixels.
  const std::int64_t in_sample = g.in_h * g.in_w * g.in_c;
  const std::int64_t pixels = g.out_h * g.out_w, total_rows = g.batch * pixels;
  const std::int64_t k = taps(g);
  const std::int64_t threads = omp_get_max_threads();
  const std::int64_t piece_rows = std::max<std::int64_t>(
      1, std::min(chunking(g).samples_per_chunk * pixels, (total_rows + threads - 1) / threads));
  const std::int64_t pieces = (total_rows + piece_rows - 1) / piece_rows;
  with_activation(activation, [&](auto activate) {
#pragma omp parallel if (pieces > 1)
    {
      float* col = thread_scratch(ScratchSlot::Columns, static_cast<std::size_t>(piece_rows * k));
#pragma omp for schedule(static)
      for (std::int64_t piece = 0; piece < pieces; ++piece) {
        const std::int64_t first = piece * piece_rows;
        const std::int64_t rows = std::min(piece_rows, total_rows - first);
        for (std::int64_t row = first; row < first + rows;) {
          const std::int64_t sample = row / pixels, pixel = row % pixels;
          const std::int64_t run = std::min(first + rows - row, pixels - pixel);
          im2col(device_data(x) + sample * in_sample, g, col + (row - first) * k, k, pixel, run);
          row += run;
        }
        float* out = device_data(y) + first * g.out_c;
        float beta = 0.0f;
        if (bias_data != nullptr) {
          // Start from the bias and accumulate the product onto it: the bias add costs no extra pass.
          for (std::int64_t r = 0; r < rows; ++r) std::memcpy(out + r * g.out_c, bias_data, sizeof(float) * g.out_c);
          beta = 1.0f;
        }
        gemm(false, false, rows, g.out_c, k, 1.0f, col, k, device_data(kernel), g.out_c, beta, out, g.out_c);
        if (activation != Activation::Linear) {
          // While the chunk's output is still in cache.
#pragma omp simd
          for (std::int64_t i = 0; i < rows * g.out_c; ++i) out[i] = activate(out[i]);
        }
      }
    }
  });
}

void CpuBackend::conv2d_backward(const PlanState* conv_plan, const Conv2dGeometry& g, const Tensor& x,
                                 const Tensor& kernel, const Tensor& dy, const Tensor& dx, const Tensor& dkernel,
                                 const Tensor& dbias) {
  if (x.dtype() == DType::BFloat16)
    return static_cast<const ConvPlan*>(conv_plan)->onednn.backward(g, x, kernel, dy, dx, dkernel, dbias);
  gemm_path();
  if (const int tile = winograd_tile_of(conv_plan, g)) {
    winograd_conv3x3_kernel_gradient(tile, device_data(x), device_data(dy), device_data(dkernel), g);
    if (dx.defined()) winograd_conv3x3_data_gradient(device_data(dy), device_data(kernel), device_data(dx), g);
    if (dbias.defined()) bias_gradient(dy, dbias);
    return;
  }
  if (direct_conv3x3_fits(g) && !dx.defined()) {  // a first layer, which needs no input gradient
    direct_conv3x3_kernel_gradient(device_data(x), device_data(dy), device_data(dkernel), g);
    if (dbias.defined()) bias_gradient(dy, dbias);
    return;
  }
  const Chunking plan = chunking(g);
  const std::int64_t in_sample = g.in_h * g.in_w * g.in_c;
  const std::int64_t pixels = g.out_h * g.out_w;
  const std::int64_t k = taps(g);
  const int threads = plan.parallel_over_chunks ? omp_get_max_threads() : 1;
  const std::int64_t per_thread = k * g.out_c;
  float* partial_kernel_grads = thread_scratch(ScratchSlot::Partials, static_cast<std::size_t>(threads * per_thread));
  std::fill_n(partial_kernel_grads, threads * per_thread, 0.0f);
  if (dx.defined()) std::memset(device_data(dx), 0, dx.bytes());

  for_each_chunk(g, plan, [&](std::int64_t chunk, float* col, int thread) {
    const std::int64_t first = chunk * plan.samples_per_chunk;
    const std::int64_t count = std::min(plan.samples_per_chunk, g.batch - first);
    const std::int64_t rows = count * pixels;
    const float* grad_out = device_data(dy) + first * pixels * g.out_c;
    for (std::int64_t s = 0; s < count; ++s) im2col(device_data(x) + (first + s) * in_sample, g, col + s * pixels * k, k);
    // dkernel += col^T * dy
    gemm(true, false, k, g.out_c, rows, 1.0f, col, k, grad_out, g.out_c, 1.0f,
         partial_kernel_grads + thread * per_thread, g.out_c);
    if (!dx.defined()) return;
    // dcol = dy * kernel^T, then scatter back onto the input gradient
    gemm(false, true, rows, k, g.out_c, 1.0f, grad_out, g.out_c, device_data(kernel), g.out_c, 0.0f, col, k);
    for (std::int64_t s = 0; s < count; ++s) col2im_add(col + s * pixels * k, g, device_data(dx) + (first + s) * in_sample);
  });

  sum_thread_partials(partial_kernel_grads, threads, per_thread, device_data(dkernel));
  if (dbias.defined()) bias_gradient(dy, dbias);
}

}  // namespace cohort::cpu
