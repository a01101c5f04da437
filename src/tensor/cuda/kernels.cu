// The CUDA backend's own kernels. Simple by design: one thread per output element, grid-stride loops,
// reductions in double with a fixed combination order; cuDNN and cuBLAS carry the heavy work.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <type_traits>

#include "kernels.hpp"
#include "tensor/activation_rules.hpp"
#include "tensor/loss_rules.hpp"
#include "tensor/update_rules.hpp"

namespace cohort::cuda::kernels {
namespace {

constexpr int kThreads = 256;

int blocks_for(std::int64_t n) {
  const std::int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 * 16 ? (blocks < 1 ? 1 : blocks) : 65535 * 16);
}

#define COHORT_GRID_STRIDE(i, n) \
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < (n); i += static_cast<std::int64_t>(blockDim.x) * gridDim.x)

// An element as float (exact), and a float stored as an element, rounded to nearest even.
__device__ inline float wide(float v) { return v; }
__device__ inline float wide(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline float wide(__half v) { return __half2float(v); }
template <class T>
__device__ inline T narrow_to(float v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(v);
  else if constexpr (std::is_same_v<T, __half>) return __float2half_rn(v);
  else return v;
}

__global__ void narrow_kernel(const float* from, std::uint16_t* to, std::int64_t n, HalfType type) {
  if (type == HalfType::BFloat16) {
    COHORT_GRID_STRIDE(i, n) to[i] = __bfloat16_as_ushort(__float2bfloat16_rn(from[i]));
  } else {
    COHORT_GRID_STRIDE(i, n) to[i] = __half_as_ushort(__float2half_rn(from[i]));
  }
}

__global__ void widen_kernel(const std::uint16_t* from, float* to, std::int64_t n, HalfType type) {
  if (type == HalfType::BFloat16) {
    COHORT_GRID_STRIDE(i, n) to[i] = __bfloat162float(__ushort_as_bfloat16(from[i]));
  } else {
    COHORT_GRID_STRIDE(i, n) to[i] = __half2float(__ushort_as_half(from[i]));
  }
}

__global__ void int_to_float_kernel(const std::int32_t* from, float* to, std::int64_t n) {
  COHORT_GRID_STRIDE(i, n) to[i] = static_cast<float>(from[i]);
}

__global__ void fill_kernel(float* x, std::int64_t n, float value) {
  COHORT_GRID_STRIDE(i, n) x[i] = value;
}

__global__ void axpy_kernel(float alpha, const float* x, float* y, std::int64_t n) {
  COHORT_GRID_STRIDE(i, n) y[i] += alpha * x[i];
}

__global__ void scale_kernel(float* x, std::int64_t n, float alpha) {
  COHORT_GRID_STRIDE(i, n) x[i] *= alpha;
}

template <class T>
__global__ void multiply_kernel(const T* a, const T* b, T* out, std::int64_t n) {
  COHORT_GRID_STRIDE(i, n) out[i] = narrow_to<T>(wide(a[i]) * wide(b[i]));
}

__global__ void moving_average_kernel(float* moving, const float* batch, std::int64_t n, float momentum) {
  COHORT_GRID_STRIDE(i, n) moving[i] = moving[i] * momentum + batch[i] * (1.0f - momentum);
}

// Block-wide sum of one double per thread; thread 0 gets the total.
__device__ double block_sum(double value) {
  __shared__ double shared[kThreads];
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) shared[threadIdx.x] += shared[threadIdx.x + width];
    __syncthreads();
  }
  return shared[0];
}

__global__ void partial_sums_kernel(const float* x, std::int64_t n, bool squares, double* partials) {
  double total = 0;
  COHORT_GRID_STRIDE(i, n) {
    const double v = x[i];
    total += squares ? v * v : v;
  }
  total = block_sum(total);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// An elementwise activation of v (Linear: v itself).
__device__ inline float activate(Activation activation, float v) {
  switch (activation) {
    case Activation::Relu: return activation_rules::relu(v);
    case Activation::Sigmoid: return activation_rules::sigmoid(v);
    case Activation::Tanh: return activation_rules::tanh(v);
    default: return v;
  }
}

// dy through the gradient of an elementwise activation whose output is y (Linear: dy itself).
__device__ inline float activation_gradient(Activation activation, float y, float dy) {
  switch (activation) {
    case Activation::Relu: return activation_rules::relu_gradient(y, dy);
    case Activation::Sigmoid: return activation_rules::sigmoid_gradient(y, dy);
    case Activation::Tanh: return activation_rules::tanh_gradient(y, dy);
    default: return dy;
  }
}

// The gradient a batch normalization's backward pass takes at element i: dy, or dy through a fused activation.
template <class T>
__device__ inline float gradient_at(const T* dy, const T* activated, Activation activation, std::int64_t i) {
  return activated == nullptr ? wide(dy[i]) : activation_gradient(activation, wide(activated[i]), wide(dy[i]));
}

template <class T, class Bias>
__global__ void bias_activation_kernel(T* y, const Bias* bias, Activation activation, std::int64_t n, std::int64_t width) {
  COHORT_GRID_STRIDE(i, n) y[i] = narrow_to<T>(activate(activation, wide(y[i]) + wide(bias[i % width])));
}

template <class T>
__global__ void activation_forward_kernel(Activation activation, const T* x, T* y, std::int64_t n) {
  COHORT_GRID_STRIDE(i, n) y[i] = activation == Activation::Linear ? x[i] : narrow_to<T>(activate(activation, wide(x[i])));
}

template <class T>
__global__ void activation_backward_kernel(Activation activation, const T* y, const T* dy, T* dx, std::int64_t n) {
  COHORT_GRID_STRIDE(i, n) {
    dx[i] = activation == Activation::Linear ? dy[i] : narrow_to<T>(activation_gradient(activation, wide(y[i]), wide(dy[i])));
  }
}

__global__ void softmax_forward_kernel(const float* x, float* y, std::int64_t rows, std::int64_t width) {
  COHORT_GRID_STRIDE(r, rows) activation_rules::softmax_row(x + r * width, y + r * width, width);
}

__global__ void softmax_backward_kernel(const float* y, const float* dy, float* dx, std::int64_t rows,
                                        std::int64_t width) {
  COHORT_GRID_STRIDE(r, rows) activation_rules::softmax_backward_row(y + r * width, dy + r * width, dx + r * width, width);
}

// Channel sums: a block covers 32 channels x 8 row lanes of one chunk of rows; partials[chunk][term][c].
constexpr int kChannelTile = 32, kRowLanes = 8, kRowsPerChunk = 256;

template <class T>
__global__ void channel_partials_kernel(ChannelSums<T> s, std::int64_t rows_per_chunk, double* partials) {
  const std::int64_t c = blockIdx.x * static_cast<std::int64_t>(kChannelTile) + threadIdx.x;
  const std::int64_t first_row = blockIdx.y * rows_per_chunk;
  const std::int64_t end_row = min(first_row + rows_per_chunk, s.rows);
  double first = 0, second = 0;
  if (c < s.channels) {
    for (std::int64_t m = first_row + threadIdx.y; m < end_row; m += kRowLanes) {
      const std::int64_t i = m * s.channels + c;
      if (s.terms == ChannelTerms::kValues) {
        const double a = wide(s.a[i]);
        first += a;
        second += a * a;
      } else {
        const double a = gradient_at(s.a, s.activated, s.activation, i);
        first += a;
        second += a * (wide(s.x[i]) - s.mean[c]) * s.inv_std[c];
      }
    }
  }
  __shared__ double shared[2][kRowLanes][kChannelTile];
  shared[0][threadIdx.y][threadIdx.x] = first;
  shared[1][threadIdx.y][threadIdx.x] = second;
  __syncthreads();
  if (threadIdx.y == 0 && c < s.channels) {
    for (int lane = 1; lane < kRowLanes; ++lane) {
      first += shared[0][lane][threadIdx.x];
      second += shared[1][lane][threadIdx.x];
    }
    double* chunk = partials + blockIdx.y * 2 * s.channels;
    chunk[c] = first;
    chunk[s.channels + c] = second;
  }
}

// The second pass: a block of 32 channels x 32 lanes adds up the chunks' partials, in a fixed order, into
// the two sums or, from them, the batch statistics (mean and variance straight from the double sums, as
// the CPU computes them).
enum class ChannelResult { kSums, kStatistics };
constexpr int kFinishLanes = 32;

__global__ void channel_finish_kernel(const double* partials, std::int64_t chunks, std::int64_t channels,
                                      ChannelResult result, std::int64_t rows, float* first, float* second) {
  const std::int64_t c = blockIdx.x * static_cast<std::int64_t>(kChannelTile) + threadIdx.x;
  double a = 0, b = 0;
  if (c < channels) {
    for (std::int64_t k = threadIdx.y; k < chunks; k += kFinishLanes) {
      a += partials[k * 2 * channels + c];
      b += partials[k * 2 * channels + channels + c];
    }
  }
  __shared__ double shared[2][kFinishLanes][kChannelTile];
  shared[0][threadIdx.y][threadIdx.x] = a;
  shared[1][threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y != 0 || c >= channels) return;
  for (int lane = 1; lane < kFinishLanes; ++lane) {
    a += shared[0][lane][threadIdx.x];
    b += shared[1][lane][threadIdx.x];
  }
  if (result == ChannelResult::kStatistics) {
    const double inverse_count = 1.0 / static_cast<double>(rows);
    const double mean = a * inverse_count;
    first[c] = static_cast<float>(mean);
    second[c] = static_cast<float>(fmax(b * inverse_count - mean * mean, 0.0));
    return;
  }
  if (first != nullptr) first[c] = static_cast<float>(a);
  if (second != nullptr) second[c] = static_cast<float>(b);
}

// Rows per chunk: kRowsPerChunk, more when the chunks would exceed the grid's y limit (65535).
std::int64_t rows_per_chunk(std::int64_t rows) {
  constexpr std::int64_t kMaxChunks = 65535;
  const std::int64_t wanted = std::max<std::int64_t>(kRowsPerChunk, (rows + kMaxChunks - 1) / kMaxChunks);
  return (wanted + kRowLanes - 1) / kRowLanes * kRowLanes;
}

std::int64_t chunks_for(std::int64_t rows) {
  return rows == 0 ? 1 : (rows + rows_per_chunk(rows) - 1) / rows_per_chunk(rows);
}

__global__ void inverse_std_kernel(const float* variance, float epsilon, float* inv_std, std::int64_t channels) {
  COHORT_GRID_STRIDE(c, channels) inv_std[c] = 1.0f / sqrtf(variance[c] + epsilon);
}

template <class T>
__global__ void normalize_kernel(const T* x, const float* mean, const float* variance, float epsilon,
                                 const float* gamma, const float* beta, Activation activation, T* y, std::int64_t n,
                                 std::int64_t channels) {
  COHORT_GRID_STRIDE(i, n) {
    const std::int64_t c = i % channels;
    const float multiplier = gamma[c] / sqrtf(variance[c] + epsilon);
    y[i] = narrow_to<T>(activate(activation, wide(x[i]) * multiplier + (beta[c] - mean[c] * multiplier)));
  }
}

template <class T>
__global__ void bn_data_gradient_kernel(const T* x, const T* dy, const T* activated, Activation activation,
                                        const float* mean, const float* inv_std, const float* gamma, const float* dbeta,
                                        const float* dgamma, T* dx, std::int64_t n, std::int64_t channels,
                                        float inverse_count) {
  COHORT_GRID_STRIDE(i, n) {
    const std::int64_t c = i % channels;
    const float a = gamma[c] * inv_std[c];
    const float b = dbeta[c] * inverse_count;
    const float s = dgamma[c] * inverse_count * inv_std[c];
    dx[i] = narrow_to<T>(a * (gradient_at(dy, activated, activation, i) - b - (wide(x[i]) - mean[c]) * s));
  }
}

template <class T>
__global__ void bn_data_gradient_inference_kernel(const T* dy, const float* inv_std, const float* gamma, T* dx,
                                                  std::int64_t n, std::int64_t channels) {
  COHORT_GRID_STRIDE(i, n) {
    const std::int64_t c = i % channels;
    dx[i] = narrow_to<T>(wide(dy[i]) * gamma[c] * inv_std[c]);
  }
}

// Where element i of an NHWC tensor (height x width x channels per sample) sits.
struct Nhwc {
  std::int64_t b, h, w, c;
};
__device__ Nhwc nhwc_of(std::int64_t i, std::int64_t height, std::int64_t width, std::int64_t channels) {
  return {i / (channels * width * height), (i / (channels * width)) % height, (i / channels) % width, i % channels};
}

struct Window {
  std::int64_t h0, h1, w0, w1;
};

__device__ Window pool_window(const Pool2dGeometry& g, std::int64_t oh, std::int64_t ow) {
  const std::int64_t h = oh * g.stride_h - g.pad_top;
  const std::int64_t w = ow * g.stride_w - g.pad_left;
  return {max(h, std::int64_t{0}), min(h + g.pool_h, g.in_h), max(w, std::int64_t{0}), min(w + g.pool_w, g.in_w)};
}

template <class T>
__global__ void pool_forward_kernel(Pool2dGeometry g, const T* x, T* y, std::int64_t n) {
  COHORT_GRID_STRIDE(i, n) {
    const auto [b, oh, ow, c] = nhwc_of(i, g.out_h, g.out_w, g.channels);
    const T* in = x + b * g.in_h * g.in_w * g.channels + c;
    const Window win = pool_window(g, oh, ow);
    if (g.mode == PoolMode::Max) {
      float best = -INFINITY;
      for (std::int64_t ih = win.h0; ih < win.h1; ++ih)
        for (std::int64_t iw = win.w0; iw < win.w1; ++iw) best = fmaxf(best, wide(in[(ih * g.in_w + iw) * g.channels]));
      y[i] = narrow_to<T>(best);
    } else {
      float total = 0;
      for (std::int64_t ih = win.h0; ih < win.h1; ++ih)
        for (std::int64_t iw = win.w0; iw < win.w1; ++iw) total += wide(in[(ih * g.in_w + iw) * g.channels]);
      const std::int64_t count = (win.h1 - win.h0) * (win.w1 - win.w0);
      y[i] = narrow_to<T>(total * (1.0f / static_cast<float>(count)));
    }
  }
}

// Gathers, per input element, the gradients of every window that routes to it: no atomics, so the result
// is the same on every run. A max window routes to its first cell equal to the forward's maximum.
template <class T>
__global__ void pool_backward_kernel(Pool2dGeometry g, const T* x, const T* y, const T* dy, T* dx, std::int64_t n) {
  COHORT_GRID_STRIDE(i, n) {
    const auto [b, ih, iw, c] = nhwc_of(i, g.in_h, g.in_w, g.channels);
    const T* in = x + b * g.in_h * g.in_w * g.channels + c;
    const std::int64_t out_base = b * g.out_h * g.out_w * g.channels + c;
    const std::int64_t low_h = ih + g.pad_top - g.pool_h + 1, low_w = iw + g.pad_left - g.pool_w + 1;
    const std::int64_t oh0 = low_h <= 0 ? 0 : (low_h + g.stride_h - 1) / g.stride_h;
    const std::int64_t ow0 = low_w <= 0 ? 0 : (low_w + g.stride_w - 1) / g.stride_w;
    const std::int64_t oh1 = min((ih + g.pad_top) / g.stride_h, g.out_h - 1);
    const std::int64_t ow1 = min((iw + g.pad_left) / g.stride_w, g.out_w - 1);
    float gradient = 0;
    for (std::int64_t oh = oh0; oh <= oh1; ++oh) {
      for (std::int64_t ow = ow0; ow <= ow1; ++ow) {
        const Window win = pool_window(g, oh, ow);
        const std::int64_t o = out_base + (oh * g.out_w + ow) * g.channels;
        if (g.mode == PoolMode::Average) {
          gradient += wide(dy[o]) * (1.0f / static_cast<float>((win.h1 - win.h0) * (win.w1 - win.w0)));
          continue;
        }
        const float best = wide(y[o]);
        bool mine = false, found = false;
        for (std::int64_t h = win.h0; h < win.h1 && !found; ++h)
          for (std::int64_t w = win.w0; w < win.w1 && !found; ++w)
            if (wide(in[(h * g.in_w + w) * g.channels]) == best) {
              found = true;
              mine = h == ih && w == iw;
            }
        if (mine) gradient += wide(dy[o]);
      }
    }
    dx[i] = narrow_to<T>(gradient);
  }
}

template <class T>
__global__ void hwio_to_ohwi_kernel(const T* hwio, T* ohwi, std::int64_t taps, std::int64_t in_c, std::int64_t out_c,
                                    std::int64_t n) {
  COHORT_GRID_STRIDE(i, n) {  // i indexes HWIO: ((tap * in_c) + ci) * out_c + co
    const std::int64_t co = i % out_c;
    const std::int64_t ci = (i / out_c) % in_c;
    const std::int64_t tap = i / (out_c * in_c);
    ohwi[(co * taps + tap) * in_c + ci] = hwio[i];
  }
}

template <class From>
__global__ void ohwi_to_hwio_kernel(const From* ohwi, float* hwio, std::int64_t taps, std::int64_t in_c,
                                    std::int64_t out_c, std::int64_t n) {
  COHORT_GRID_STRIDE(i, n) {
    const std::int64_t co = i % out_c;
    const std::int64_t ci = (i / out_c) % in_c;
    const std::int64_t tap = i / (out_c * in_c);
    hwio[i] = wide(ohwi[(co * taps + tap) * in_c + ci]);
  }
}

template <class T>
__global__ void pad_kernel(PaddedImage p, const T* x, T* padded, std::int64_t n) {
  COHORT_GRID_STRIDE(i, n) {  // i indexes the padded image
    const auto [b, padded_row, padded_column, c] = nhwc_of(i, p.padded_h, p.padded_w, p.channels);
    const std::int64_t h = padded_row - p.pad_top, w = padded_column - p.pad_left;
    const bool inside = h >= 0 && h < p.in_h && w >= 0 && w < p.in_w;
    padded[i] = inside ? x[((b * p.in_h + h) * p.in_w + w) * p.channels + c] : narrow_to<T>(0.0f);
  }
}

template <class T>
__global__ void crop_kernel(PaddedImage p, const T* padded, T* x, std::int64_t n) {
  COHORT_GRID_STRIDE(i, n) {  // i indexes the unpadded image
    const auto [b, h, w, c] = nhwc_of(i, p.in_h, p.in_w, p.channels);
    // Input cells no window reaches (past the last stride) get no gradient.
    const std::int64_t ph = h + p.pad_top, pw = w + p.pad_left;
    x[i] = ph < p.padded_h && pw < p.padded_w ? padded[((b * p.padded_h + ph) * p.padded_w + pw) * p.channels + c]
                                              : narrow_to<T>(0.0f);
  }
}

template <class T>
__global__ void dropout_kernel(T* mask, std::int64_t n, DropoutRule rule, std::uint64_t seed, const std::uint64_t* step) {
  if (step != nullptr) rule.key = DropoutRule::key_of(derive_seed(seed, *step));
  COHORT_GRID_STRIDE(i, n) mask[i] = narrow_to<T>(rule(static_cast<std::uint64_t>(i)));
}

__global__ void write_bits_kernel(std::uint32_t* destination, std::uint64_t bits, int words) {
  destination[0] = static_cast<std::uint32_t>(bits);
  if (words == 2) destination[1] = static_cast<std::uint32_t>(bits >> 32);
}

__global__ void expand_images_kernel(ImageExpansion expansion, const std::uint8_t* images, std::int64_t stored,
                                     const std::int32_t* indices, const std::int32_t* draws, const float* mean,
                                     const float* stddev, float* out, std::int64_t n) {
  COHORT_GRID_STRIDE(i, n) {
    const auto [b, y, x, c] = nhwc_of(i, expansion.height, expansion.width, expansion.channels);
    const std::int64_t source = indices != nullptr ? indices[b] : b;
    const std::int32_t* draw = draws + b * 3;
    const std::uint8_t* sample = images + source * expansion.height * expansion.width * expansion.channels;
    out[i] = source >= 0 && source < stored ? expansion(sample, y, x, c, draw[0], draw[1], draw[2], mean[c], stddev[c])
                                            : 0.0f;
  }
}

// The list kernels: blockIdx.y picks the variable, the x blocks stride over its elements.
#define COHORT_LIST_STRIDE(i, list)                                                                         \
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < (list).size[blockIdx.y]; \
       i += static_cast<std::int64_t>(blockDim.x) * gridDim.x)

__global__ void sgd_kernel(TensorList list, const float* step_size, float momentum, bool nesterov, float weight_decay) {
  float* w = list.operand[0][blockIdx.y];
  const float* g = list.operand[1][blockIdx.y];
  float* v = list.operand[2][blockIdx.y];
  const float learning_rate = *step_size;
  COHORT_LIST_STRIDE(i, list)
  update_rules::sgd(w[i], g[i], v == nullptr ? nullptr : v + i, learning_rate, momentum, nesterov, weight_decay);
}

__global__ void adam_kernel(TensorList list, const float* step_size, float beta_1, float beta_2, float epsilon,
                            float weight_decay) {
  float* w = list.operand[0][blockIdx.y];
  const float* g = list.operand[1][blockIdx.y];
  float* m = list.operand[2][blockIdx.y];
  float* v = list.operand[3][blockIdx.y];
  const float learning_rate = *step_size;
  COHORT_LIST_STRIDE(i, list)
  update_rules::adam(w[i], g[i], m[i], v[i], learning_rate, beta_1, beta_2, epsilon, weight_decay);
}

__global__ void rmsprop_kernel(TensorList list, const float* step_size, float rho, float momentum, float epsilon,
                               float weight_decay) {
  float* w = list.operand[0][blockIdx.y];
  const float* g = list.operand[1][blockIdx.y];
  float* ms = list.operand[2][blockIdx.y];
  float* mg = list.operand[3][blockIdx.y];
  float* velocity = list.operand[4][blockIdx.y];
  const float learning_rate = *step_size;
  COHORT_LIST_STRIDE(i, list)
  update_rules::rmsprop(w[i], g[i], ms[i], mg == nullptr ? nullptr : mg + i, velocity == nullptr ? nullptr : velocity + i,
                        learning_rate, rho, momentum, epsilon, weight_decay);
}

// Enough x blocks for the largest variable, at most 1024 (each then strides).
dim3 list_grid(const TensorList& list) {
  std::int64_t largest = 1;
  for (int t = 0; t < list.count; ++t) largest = std::max(largest, list.size[t]);
  return dim3(static_cast<unsigned>(std::min(blocks_for(largest), 1024)), static_cast<unsigned>(list.count));
}

// The target weight of class j in row r, and the row's label (arg-max of dense targets).
__device__ float target_weight(const LossRows& l, std::int64_t r, std::int64_t j) {
  if (!l.sparse) return l.labels[r * l.classes + j];
  return static_cast<std::int64_t>(l.labels[r]) == j ? 1.0f : 0.0f;
}

// False when a sparse label is not a class index: the row is reported, counts for nothing and, where a
// gradient is asked for, gets zeros (the error comes at the next read, after this step's backward pass).
__device__ bool label_valid(const LossRows& l, std::int64_t r, float* gradient = nullptr) {
  if (!l.sparse) return true;
  const float v = l.labels[r];
  if (v >= 0 && v < static_cast<float>(l.classes) && v == floorf(v)) return true;
  atomicMin(l.bad_row, static_cast<unsigned long long>(r));
  l.row_values[r] = 0;
  if (gradient != nullptr)
    for (std::int64_t j = 0; j < l.classes; ++j) gradient[r * l.classes + j] = 0.0f;
  return false;
}

__device__ std::int64_t arg_max(const float* row, std::int64_t width) {
  std::int64_t best = 0;
  for (std::int64_t j = 1; j < width; ++j)
    if (row[j] > row[best]) best = j;
  return best;
}

__global__ void softmax_cross_entropy_kernel(LossRows l, float* dlogits) {
  COHORT_GRID_STRIDE(r, l.rows) {
    if (!label_valid(l, r, dlogits)) continue;
    const float* row = l.scores + r * l.classes;
    float peak = -FLT_MAX;
    for (std::int64_t j = 0; j < l.classes; ++j) peak = fmaxf(peak, row[j]);
    double normalizer = 0;
    for (std::int64_t j = 0; j < l.classes; ++j) normalizer += exp(static_cast<double>(row[j] - peak));
    const double log_normalizer = log(normalizer) + peak;
    double loss = 0, target_mass = 0;
    for (std::int64_t j = 0; j < l.classes; ++j) {
      const double w = target_weight(l, r, j);
      loss += w * (log_normalizer - row[j]);
      target_mass += w;
    }
    l.row_values[r] = loss;
    if (dlogits == nullptr) continue;
    const double inverse_rows = 1.0 / static_cast<double>(l.rows);
    for (std::int64_t j = 0; j < l.classes; ++j) {
      const double p = exp(row[j] - log_normalizer);
      dlogits[r * l.classes + j] = static_cast<float>((p * target_mass - target_weight(l, r, j)) * inverse_rows);
    }
  }
}

__global__ void categorical_cross_entropy_kernel(LossRows l, float* dprobabilities) {
  constexpr float kEpsilon = 1e-7f;
  COHORT_GRID_STRIDE(r, l.rows) {
    if (!label_valid(l, r, dprobabilities)) continue;
    const double inverse_rows = 1.0 / static_cast<double>(l.rows);
    double loss = 0;
    for (std::int64_t j = 0; j < l.classes; ++j) {
      const float raw = l.scores[r * l.classes + j];
      const float p = fminf(fmaxf(raw, kEpsilon), 1.0f - kEpsilon);
      const float w = target_weight(l, r, j);
      loss -= w * logf(p);
      if (dprobabilities != nullptr) {
        const bool clipped = raw < kEpsilon || raw > 1.0f - kEpsilon;
        dprobabilities[r * l.classes + j] = clipped ? 0.0f : static_cast<float>(-w / p * inverse_rows);
      }
    }
    l.row_values[r] = loss;
  }
}

__global__ void count_correct_kernel(LossRows l) {
  COHORT_GRID_STRIDE(r, l.rows) {
    if (!label_valid(l, r)) continue;
    const std::int64_t label =
        l.sparse ? static_cast<std::int64_t>(l.labels[r]) : arg_max(l.labels + r * l.classes, l.classes);
    l.row_values[r] = arg_max(l.scores + r * l.classes, l.classes) == label ? 1.0 : 0.0;
  }
}

__global__ void count_top_k_kernel(LossRows l, int k) {
  COHORT_GRID_STRIDE(r, l.rows) {
    if (!label_valid(l, r)) continue;
    const float* row = l.scores + r * l.classes;
    const std::int64_t label =
        l.sparse ? static_cast<std::int64_t>(l.labels[r]) : arg_max(l.labels + r * l.classes, l.classes);
    // Ties count against the label, as a strict ranking would place it last among equals; a score that is
    // not finite ranks nowhere.
    std::int64_t at_least_as_high = 0;
    for (std::int64_t j = 0; j < l.classes; ++j) at_least_as_high += row[j] >= row[label] ? 1 : 0;
    l.row_values[r] = isfinite(row[label]) && at_least_as_high - 1 < k ? 1.0 : 0.0;
  }
}

// l.classes is the outputs per row and l.labels the targets, one per output. Narrow rows take a thread each.
__global__ void elementwise_loss_kernel(ElementwiseLoss loss, LossRows l, float* gradient) {
  const double inverse_outputs = 1.0 / static_cast<double>(l.classes);
  const double inverse_elements = 1.0 / static_cast<double>(l.rows * l.classes);
  COHORT_GRID_STRIDE(r, l.rows) {
    double row_total = 0;
    for (std::int64_t i = r * l.classes; i < (r + 1) * l.classes; ++i) {
      double d = 0;
      row_total += loss_rules::elementwise_loss(loss, l.scores[i], l.labels[i], d);
      if (gradient != nullptr) gradient[i] = static_cast<float>(d * inverse_elements);
    }
    l.row_values[r] = row_total * inverse_outputs;
  }
}

// Wide rows (an image per sample) take a block each: its threads stride over the row, reading neighbouring
// outputs together, and sum in a fixed order.
__global__ void elementwise_loss_wide_kernel(ElementwiseLoss loss, LossRows l, float* gradient) {
  const double inverse_outputs = 1.0 / static_cast<double>(l.classes);
  const double inverse_elements = 1.0 / static_cast<double>(l.rows * l.classes);
  for (std::int64_t r = blockIdx.x; r < l.rows; r += gridDim.x) {
    double mine = 0;
    for (std::int64_t i = r * l.classes + threadIdx.x; i < (r + 1) * l.classes; i += blockDim.x) {
      double d = 0;
      mine += loss_rules::elementwise_loss(loss, l.scores[i], l.labels[i], d);
      if (gradient != nullptr) gradient[i] = static_cast<float>(d * inverse_elements);
    }
    const double row_total = block_sum(mine);
    if (threadIdx.x == 0) l.row_values[r] = row_total * inverse_outputs;
    __syncthreads();  // every thread has read the sum before the next row's block_sum overwrites it
  }
}

// One block adds the rows' values to the slot in an order fixed by the row count, so that a run repeats its
// sums bit for bit, and keeps the first bad label the sums have met.
__global__ void add_rows_kernel(LossRows l, double* sum, double* bad_label) {
  double mine = 0;
  for (std::int64_t r = threadIdx.x; r < l.rows; r += kThreads) mine += l.row_values[r];
  const double total = block_sum(mine);
  if (threadIdx.x != 0) return;
  *sum += total;
  const unsigned long long row = *l.bad_row;
  if (row == ~0ull || bad_label[0] != 0) return;
  bad_label[0] = static_cast<double>(row) + 1;
  bad_label[1] = l.labels[row];
  bad_label[2] = static_cast<double>(l.classes);
}

}  // namespace

void narrow(const float* from, std::uint16_t* to, std::int64_t n, HalfType type, cudaStream_t stream) {
  if (n > 0) narrow_kernel<<<blocks_for(n), kThreads, 0, stream>>>(from, to, n, type);
}
void widen(const std::uint16_t* from, float* to, std::int64_t n, HalfType type, cudaStream_t stream) {
  if (n > 0) widen_kernel<<<blocks_for(n), kThreads, 0, stream>>>(from, to, n, type);
}
void int_to_float(const std::int32_t* from, float* to, std::int64_t n, cudaStream_t stream) {
  if (n > 0) int_to_float_kernel<<<blocks_for(n), kThreads, 0, stream>>>(from, to, n);
}
void fill(float* x, std::int64_t n, float value, cudaStream_t stream) {
  if (n > 0) fill_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, value);
}
void axpy(float alpha, const float* x, float* y, std::int64_t n, cudaStream_t stream) {
  if (n > 0) axpy_kernel<<<blocks_for(n), kThreads, 0, stream>>>(alpha, x, y, n);
}
void scale(float* x, std::int64_t n, float alpha, cudaStream_t stream) {
  if (n > 0) scale_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, alpha);
}
template <class T>
void multiply(const T* a, const T* b, T* out, std::int64_t n, cudaStream_t stream) {
  if (n > 0) multiply_kernel<<<blocks_for(n), kThreads, 0, stream>>>(a, b, out, n);
}
void moving_average(float* moving, const float* batch, std::int64_t n, float momentum, cudaStream_t stream) {
  if (n > 0) moving_average_kernel<<<blocks_for(n), kThreads, 0, stream>>>(moving, batch, n, momentum);
}

int partial_sums(const float* x, std::int64_t n, bool squares, double* partials, cudaStream_t stream) {
  const int blocks = std::min(blocks_for(n), kMaxPartials);
  partial_sums_kernel<<<blocks, kThreads, 0, stream>>>(x, n, squares, partials);
  return blocks;
}

template <class T, class Bias>
void bias_activation(T* y, const Bias* bias, Activation activation, std::int64_t rows, std::int64_t width,
                     cudaStream_t stream) {
  const std::int64_t n = rows * width;
  if (n > 0) bias_activation_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, bias, activation, n, width);
}

template <class T>
void activation_forward(Activation activation, const T* x, T* y, std::int64_t n, std::int64_t width,
                        cudaStream_t stream) {
  if (n == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    if (activation == Activation::Softmax) {
      const std::int64_t rows = width == 0 ? 0 : n / width;
      if (rows > 0) softmax_forward_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(x, y, rows, width);
      return;
    }
  }
  activation_forward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(activation, x, y, n);
}

template <class T>
void activation_backward(Activation activation, const T* y, const T* dy, T* dx, std::int64_t n, std::int64_t width,
                         cudaStream_t stream) {
  if (n == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    if (activation == Activation::Softmax) {
      const std::int64_t rows = width == 0 ? 0 : n / width;
      if (rows > 0) softmax_backward_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(y, dy, dx, rows, width);
      return;
    }
  }
  activation_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(activation, y, dy, dx, n);
}

std::int64_t channel_sums_scratch(std::int64_t rows, std::int64_t channels) {
  return chunks_for(rows) * 2 * channels;
}

namespace {
// The first pass of every per-channel reduction; returns the number of chunks written.
template <class T>
std::int64_t channel_partials(const ChannelSums<T>& s, double* scratch, cudaStream_t stream) {
  const std::int64_t chunks = chunks_for(s.rows);
  const dim3 grid(static_cast<unsigned>((s.channels + kChannelTile - 1) / kChannelTile), static_cast<unsigned>(chunks));
  channel_partials_kernel<<<grid, dim3(kChannelTile, kRowLanes), 0, stream>>>(s, rows_per_chunk(s.rows), scratch);
  return chunks;
}

void channel_finish(const double* partials, std::int64_t chunks, std::int64_t channels, ChannelResult result,
                    std::int64_t rows, float* first, float* second, cudaStream_t stream) {
  const auto tiles = static_cast<unsigned>((channels + kChannelTile - 1) / kChannelTile);
  channel_finish_kernel<<<tiles, dim3(kChannelTile, kFinishLanes), 0, stream>>>(partials, chunks, channels, result,
                                                                                rows, first, second);
}
}  // namespace

template <class T>
void channel_sums(const ChannelSums<T>& s, double* scratch, float* first, float* second, cudaStream_t stream) {
  if (s.channels == 0) return;
  const std::int64_t chunks = channel_partials(s, scratch, stream);
  channel_finish(scratch, chunks, s.channels, ChannelResult::kSums, s.rows, first, second, stream);
}

template <class T>
void batch_statistics(const T* x, std::int64_t rows, std::int64_t channels, double* scratch, float* mean,
                      float* variance, cudaStream_t stream) {
  if (channels == 0) return;
  ChannelSums<T> sums;
  sums.a = x;
  sums.rows = rows;
  sums.channels = channels;
  const std::int64_t chunks = channel_partials(sums, scratch, stream);
  channel_finish(scratch, chunks, channels, ChannelResult::kStatistics, rows, mean, variance, stream);
}

void inverse_std(const float* variance, float epsilon, float* inv_std, std::int64_t channels, cudaStream_t stream) {
  if (channels > 0) inverse_std_kernel<<<blocks_for(channels), kThreads, 0, stream>>>(variance, epsilon, inv_std, channels);
}

template <class T>
void batch_norm_normalize(const T* x, const float* mean, const float* variance, float epsilon, const float* gamma,
                          const float* beta, Activation activation, T* y, std::int64_t rows, std::int64_t channels,
                          cudaStream_t stream) {
  const std::int64_t n = rows * channels;
  if (n > 0)
    normalize_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, mean, variance, epsilon, gamma, beta, activation, y, n,
                                                             channels);
}

template <class T>
void batch_norm_data_gradient(const T* x, const T* dy, const T* activated, Activation activation, const float* mean,
                              const float* inv_std, const float* gamma, const float* dbeta, const float* dgamma, T* dx,
                              std::int64_t rows, std::int64_t channels, cudaStream_t stream) {
  const std::int64_t n = rows * channels;
  if (n == 0) return;
  bn_data_gradient_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, dy, activated, activation, mean, inv_std, gamma,
                                                                  dbeta, dgamma, dx, n, channels,
                                                                  1.0f / static_cast<float>(rows));
}

template <class T>
void batch_norm_data_gradient_inference(const T* dy, const float* inv_std, const float* gamma, T* dx, std::int64_t rows,
                                        std::int64_t channels, cudaStream_t stream) {
  const std::int64_t n = rows * channels;
  if (n > 0) bn_data_gradient_inference_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dy, inv_std, gamma, dx, n, channels);
}

template <class T>
void pool2d_forward(const Pool2dGeometry& g, const T* x, T* y, cudaStream_t stream) {
  const std::int64_t n = g.batch * g.out_h * g.out_w * g.channels;
  if (n > 0) pool_forward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(g, x, y, n);
}

template <class T>
void pool2d_backward(const Pool2dGeometry& g, const T* x, const T* y, const T* dy, T* dx, cudaStream_t stream) {
  const std::int64_t n = g.batch * g.in_h * g.in_w * g.channels;
  if (n > 0) pool_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(g, x, y, dy, dx, n);
}

template <class T>
void hwio_to_ohwi(const T* hwio, T* ohwi, std::int64_t taps, std::int64_t in_c, std::int64_t out_c, cudaStream_t stream) {
  const std::int64_t n = taps * in_c * out_c;
  if (n > 0) hwio_to_ohwi_kernel<<<blocks_for(n), kThreads, 0, stream>>>(hwio, ohwi, taps, in_c, out_c, n);
}

template <class From>
void ohwi_to_hwio(const From* ohwi, float* hwio, std::int64_t taps, std::int64_t in_c, std::int64_t out_c,
                  cudaStream_t stream) {
  const std::int64_t n = taps * in_c * out_c;
  if (n > 0) ohwi_to_hwio_kernel<<<blocks_for(n), kThreads, 0, stream>>>(ohwi, hwio, taps, in_c, out_c, n);
}

template <class T>
void pad_images(const PaddedImage& p, const T* x, T* padded, cudaStream_t stream) {
  const std::int64_t n = p.batch * p.padded_h * p.padded_w * p.channels;
  if (n > 0) pad_kernel<<<blocks_for(n), kThreads, 0, stream>>>(p, x, padded, n);
}

template <class T>
void crop_images(const PaddedImage& p, const T* padded, T* x, cudaStream_t stream) {
  const std::int64_t n = p.batch * p.in_h * p.in_w * p.channels;
  if (n > 0) crop_kernel<<<blocks_for(n), kThreads, 0, stream>>>(p, padded, x, n);
}

template <class T>
void dropout_mask(T* mask, std::int64_t n, const DropoutRule& rule, std::uint64_t seed, const std::uint64_t* step,
                  cudaStream_t stream) {
  if (n > 0) dropout_kernel<<<blocks_for(n), kThreads, 0, stream>>>(mask, n, rule, seed, step);
}

void write_bits(void* destination, std::uint64_t bits, int bytes, cudaStream_t stream) {
  write_bits_kernel<<<1, 1, 0, stream>>>(static_cast<std::uint32_t*>(destination), bits, bytes / 4);
}

void expand_images(const ImageExpansion& expansion, std::int64_t batch, const std::uint8_t* images, std::int64_t stored,
                   const std::int32_t* indices, const std::int32_t* draws, const float* mean, const float* stddev,
                   float* out, cudaStream_t stream) {
  const std::int64_t n = batch * expansion.height * expansion.width * expansion.channels;
  if (n > 0)
    expand_images_kernel<<<blocks_for(n), kThreads, 0, stream>>>(expansion, images, stored, indices, draws, mean,
                                                                  stddev, out, n);
}

void sgd_update(const TensorList& list, const float* step_size, float momentum, bool nesterov, float weight_decay,
                cudaStream_t stream) {
  if (list.count > 0)
    sgd_kernel<<<list_grid(list), kThreads, 0, stream>>>(list, step_size, momentum, nesterov, weight_decay);
}

void adam_update(const TensorList& list, const float* step_size, float beta_1, float beta_2, float epsilon,
                 float weight_decay, cudaStream_t stream) {
  if (list.count > 0)
    adam_kernel<<<list_grid(list), kThreads, 0, stream>>>(list, step_size, beta_1, beta_2, epsilon, weight_decay);
}

void rmsprop_update(const TensorList& list, const float* step_size, float rho, float momentum, float epsilon,
                    float weight_decay, cudaStream_t stream) {
  if (list.count > 0)
    rmsprop_kernel<<<list_grid(list), kThreads, 0, stream>>>(list, step_size, rho, momentum, epsilon, weight_decay);
}

void softmax_cross_entropy(const LossRows& rows, float* dlogits, cudaStream_t stream) {
  if (rows.rows > 0) softmax_cross_entropy_kernel<<<blocks_for(rows.rows), kThreads, 0, stream>>>(rows, dlogits);
}

void categorical_cross_entropy(const LossRows& rows, float* dprobabilities, cudaStream_t stream) {
  if (rows.rows > 0)
    categorical_cross_entropy_kernel<<<blocks_for(rows.rows), kThreads, 0, stream>>>(rows, dprobabilities);
}

void count_correct(const LossRows& rows, cudaStream_t stream) {
  if (rows.rows > 0) count_correct_kernel<<<blocks_for(rows.rows), kThreads, 0, stream>>>(rows);
}

void count_top_k(const LossRows& rows, int k, cudaStream_t stream) {
  if (rows.rows > 0) count_top_k_kernel<<<blocks_for(rows.rows), kThreads, 0, stream>>>(rows, k);
}

void elementwise_loss(ElementwiseLoss loss, const LossRows& rows, float* gradient, cudaStream_t stream) {
  if (rows.rows == 0 || rows.classes == 0) return;
  if (rows.classes < kThreads / 4) {
    elementwise_loss_kernel<<<blocks_for(rows.rows), kThreads, 0, stream>>>(loss, rows, gradient);
  } else {
    const auto blocks = static_cast<int>(rows.rows < 65535 * 16 ? rows.rows : 65535 * 16);
    elementwise_loss_wide_kernel<<<blocks, kThreads, 0, stream>>>(loss, rows, gradient);
  }
}

void add_rows(const LossRows& rows, double* sum, double* bad_label, cudaStream_t stream) {
  if (rows.rows > 0) add_rows_kernel<<<1, kThreads, 0, stream>>>(rows, sum, bad_label);
}

// The element types of the templated launchers (kernels.hpp).
#define COHORT_FOR_EACH_ELEMENT_TYPE(T)                                                                               \
  template void multiply<T>(const T*, const T*, T*, std::int64_t, cudaStream_t);                                     \
  template void bias_activation<T, float>(T*, const float*, Activation, std::int64_t, std::int64_t, cudaStream_t);     \
  template void activation_forward<T>(Activation, const T*, T*, std::int64_t, std::int64_t, cudaStream_t);            \
  template void activation_backward<T>(Activation, const T*, const T*, T*, std::int64_t, std::int64_t, cudaStream_t); \
  template void channel_sums<T>(const ChannelSums<T>&, double*, float*, float*, cudaStream_t);                         \
  template void batch_statistics<T>(const T*, std::int64_t, std::int64_t, double*, float*, float*, cudaStream_t);     \
  template void batch_norm_normalize<T>(const T*, const float*, const float*, float, const float*, const float*,       \
                                        Activation, T*, std::int64_t, std::int64_t, cudaStream_t);                    \
  template void batch_norm_data_gradient<T>(const T*, const T*, const T*, Activation, const float*, const float*,      \
                                            const float*, const float*, const float*, T*, std::int64_t, std::int64_t,  \
                                            cudaStream_t);                                                            \
  template void batch_norm_data_gradient_inference<T>(const T*, const float*, const float*, T*, std::int64_t,         \
                                                      std::int64_t, cudaStream_t);                                    \
  template void pool2d_forward<T>(const Pool2dGeometry&, const T*, T*, cudaStream_t);                                 \
  template void pool2d_backward<T>(const Pool2dGeometry&, const T*, const T*, const T*, T*, cudaStream_t);             \
  template void hwio_to_ohwi<T>(const T*, T*, std::int64_t, std::int64_t, std::int64_t, cudaStream_t);                \
  template void ohwi_to_hwio<T>(const T*, float*, std::int64_t, std::int64_t, std::int64_t, cudaStream_t);            \
  template void pad_images<T>(const PaddedImage&, const T*, T*, cudaStream_t);                                        \
  template void crop_images<T>(const PaddedImage&, const T*, T*, cudaStream_t);                                       \
  template void dropout_mask<T>(T*, std::int64_t, const DropoutRule&, std::uint64_t, const std::uint64_t*, cudaStream_t);
COHORT_FOR_EACH_ELEMENT_TYPE(float)
COHORT_FOR_EACH_ELEMENT_TYPE(__nv_bfloat16)
COHORT_FOR_EACH_ELEMENT_TYPE(__half)
#undef COHORT_FOR_EACH_ELEMENT_TYPE
template void bias_activation<__nv_bfloat16, __nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, Activation, std::int64_t,
                                                            std::int64_t, cudaStream_t);
template void bias_activation<__half, __half>(__half*, const __half*, Activation, std::int64_t, std::int64_t,
                                              cudaStream_t);

}  // namespace cohort::cuda::kernels
