// Winograd F(m x m, 3x3) (Lavin and Gray, 2015) for NHWC tensors, m = 2 or 4.
//
// Each m x m block of output pixels ("tile") is computed from the a x a input patch under it (a = m + 2).
// With the transforms V = B^T d B (input patch), U = G g G^T (kernel) and Y = A^T M A (output), the 3x3
// convolution becomes a x a independent products M[k] = V[k] * U[k], one per position k of the
// transformed patch, each a GEMM of (tiles x in_channels) by (in_channels x out_channels): a^2 / m^2
// multiply-adds per output and channel pair instead of 9 (4 for m = 2, 2.25 for m = 4), for a few
// additions per value in the transforms. Every transform is separable: a 1-D transform applied to the
// columns, then to the rows. Transformed data is laid out tile-major ([tile][k][channel]) so that the
// transforms read and write contiguous runs; each GEMM reads its k with a row stride. Tiles are
// processed in chunks whose transformed inputs and products fit in the cache, chunks spread over
// threads; chunks write disjoint output tiles.
//
// This file is compiled once per instruction set (portable, AVX2, AVX-512), each copy naming its table
// COHORT_WINOGRAD_KERNELS; winograd.cpp chooses among them at run time. Its code must have internal
// linkage or call non-inline functions only: an inline or template function from a header (std::vector,
// std::min) would be compiled into every copy, and the linker would keep one, perhaps the AVX-512 one,
// for all callers. The test winograd_variants checks the objects for such symbols.
#include "winograd_kernels.hpp"

#include <omp.h>

#include <cstring>

#include "cpu_backend.hpp"
#include "scratch.hpp"

namespace cohort::cpu {
namespace {

// std::min and std::max are inline templates: see the top of the file.
constexpr std::int64_t smaller(std::int64_t a, std::int64_t b) { return a < b ? a : b; }
constexpr std::int64_t larger(std::int64_t a, std::int64_t b) { return a < b ? b : a; }

constexpr std::int64_t kChunkFloats = 1 << 18;  // about 1 MiB of transformed data per chunk
constexpr std::int64_t kMinTiles = 96;

// The 1-D transforms of F(m, 3), from the interpolation points 0, 1, -1 (and 2, -2 for m = 4) and infinity.
template <int M>
struct Transforms;

template <>
struct Transforms<2> {
  static constexpr int kAlpha = 4;
  template <typename V>
  static void input(const V* d, V* t) {  // B^T d
    t[0] = d[0] - d[2];
    t[1] = d[1] + d[2];
    t[2] = d[2] - d[1];
    t[3] = d[1] - d[3];
  }
  template <typename V>
  static void output(const V* s, V* o) {  // A^T s
    o[0] = s[0] + s[1] + s[2];
    o[1] = s[1] - s[2] - s[3];
  }
  template <typename V>
  static void kernel(const V* g, V* u) {  // G g
    u[0] = g[0];
    u[1] = 0.5f * (g[0] + g[1] + g[2]);
    u[2] = 0.5f * (g[0] - g[1] + g[2]);
    u[3] = g[2];
  }
  template <typename V>
  static void output_gradient(const V* e, V* r) {  // A e, the adjoint of output()
    r[0] = e[0];
    r[1] = e[0] + e[1];
    r[2] = e[0] - e[1];
    r[3] = -e[1];
  }
  template <typename V>
  static void kernel_gradient(const V* d, V* s) {  // G^T d, the adjoint of kernel()
    s[0] = d[0] + 0.5f * (d[1] + d[2]);
    s[1] = 0.5f * (d[1] - d[2]);
    s[2] = 0.5f * (d[1] + d[2]) + d[3];
  }
};

template <>
struct Transforms<4> {
  static constexpr int kAlpha = 6;
  template <typename V>
  static void input(const V* d, V* t) {
    t[0] = 4.0f * d[0] - 5.0f * d[2] + d[4];
    t[1] = d[3] + d[4] - 4.0f * (d[1] + d[2]);
    t[2] = 4.0f * (d[1] - d[2]) + d[4] - d[3];
    t[3] = 2.0f * (d[3] - d[1]) + d[4] - d[2];
    t[4] = 2.0f * (d[1] - d[3]) + d[4] - d[2];
    t[5] = 4.0f * d[1] - 5.0f * d[3] + d[5];
  }
  template <typename V>
  static void output(const V* s, V* o) {
    const V sum12 = s[1] + s[2], difference12 = s[1] - s[2], sum34 = s[3] + s[4], difference34 = s[3] - s[4];
    o[0] = s[0] + sum12 + sum34;
    o[1] = difference12 + 2.0f * difference34;
    o[2] = sum12 + 4.0f * sum34;
    o[3] = difference12 + 8.0f * difference34 + s[5];
  }
  template <typename V>
  static void kernel(const V* g, V* u) {
    u[0] = g[0] / 4.0f;
    u[1] = -(g[0] + g[1] + g[2]) / 6.0f;
    u[2] = -(g[0] - g[1] + g[2]) / 6.0f;
    u[3] = g[0] / 24.0f + g[1] / 12.0f + g[2] / 6.0f;
    u[4] = g[0] / 24.0f - g[1] / 12.0f + g[2] / 6.0f;
    u[5] = g[2];
  }
  template <typename V>
  static void output_gradient(const V* e, V* r) {
    r[0] = e[0];
    r[1] = e[0] + e[1] + e[2] + e[3];
    r[2] = e[0] - e[1] + e[2] - e[3];
    r[3] = e[0] + 2.0f * e[1] + 4.0f * e[2] + 8.0f * e[3];
    r[4] = e[0] - 2.0f * e[1] + 4.0f * e[2] - 8.0f * e[3];
    r[5] = e[3];
  }
  template <typename V>
  static void kernel_gradient(const V* d, V* s) {
    s[0] = d[0] / 4.0f - (d[1] + d[2]) / 6.0f + (d[3] + d[4]) / 24.0f;
    s[1] = (d[2] - d[1]) / 6.0f + (d[3] - d[4]) / 12.0f;
    s[2] = (d[3] + d[4] - d[1] - d[2]) / 6.0f + d[5];
  }
};

// y = T x T^T for a separable transform T (In values to Out): `transform` on every column, then every row.
template <int In, int Out, typename V, void (*transform)(const V*, V*)>
inline void separable(const V (&x)[In][In], V (&y)[Out][Out]) {
  V columns[Out][In];
  for (int j = 0; j < In; ++j) {
    V column[In], transformed[Out];
    for (int i = 0; i < In; ++i) column[i] = x[i][j];
    transform(column, transformed);
    for (int i = 0; i < Out; ++i) columns[i][j] = transformed[i];
  }
  for (int i = 0; i < Out; ++i) transform(columns[i], y[i]);
}

// The transforms run on eight channels at a time (one AVX register, two SSE ones; GCC's and clang's vector
// extension), the channels left over one at a time, with the same code.
using Lanes = float __attribute__((vector_size(32)));
constexpr std::int64_t kLanes = 8;

template <typename V>
V load(const float* from) {
  V value;
  std::memcpy(&value, from, sizeof value);
  return value;
}

template <typename V>
void store(float* to, const V& value) {
  std::memcpy(to, &value, sizeof value);
}

// max(v, 0) per lane, as a select (no branch per lane).
template <typename V>
V positive_part(V v) {
  return v > 0.0f ? v : V{};
}

// One position's product M = V U (count x F = count x C times C x F, beta 0) for up to 64 input channels,
// where a register-blocked kernel without packing beats the library GEMMs, whose packing and calls cost
// more than the few multiplications of each product. Built where the compiler targets AVX2 (16 vector
// registers with FMA); elsewhere, and for more channels, the GEMM.
#if defined(__AVX2__)
constexpr std::int64_t kMaxBlockedChannels = 64;

// c[r][0, 8 L) = sum over k of a[r][k] * b[k][0, 8 L) for R rows: R x L accumulators stay in registers.
template <int R, int L>
inline void product_block(const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float* c, std::int64_t ldc,
                          std::int64_t depth) {
  // The first term (depth >= 1) initializes the sums: zeroing the array instead compiles to a string store
  // that took a fifth of this function's time.
  Lanes sums[R][L], row[L];
  for (int l = 0; l < L; ++l) row[l] = load<Lanes>(b + kLanes * l);
  for (int r = 0; r < R; ++r)
    for (int l = 0; l < L; ++l) sums[r][l] = a[r * lda] * row[l];
  for (std::int64_t k = 1; k < depth; ++k) {
    for (int l = 0; l < L; ++l) row[l] = load<Lanes>(b + k * ldb + kLanes * l);
    for (int r = 0; r < R; ++r) {
      const float scalar = a[r * lda + k];
      for (int l = 0; l < L; ++l) sums[r][l] += scalar * row[l];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int l = 0; l < L; ++l) store(c + r * ldc + kLanes * l, sums[r][l]);
}

// All rows of the columns [first, first + 8 L), six at a time.
template <int L>
void product_columns(std::int64_t rows, std::int64_t first, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                     float* c, std::int64_t ldc, std::int64_t depth) {
  std::int64_t r = 0;
  for (; r + 6 <= rows; r += 6) product_block<6, L>(a + r * lda, lda, b + first, ldb, c + r * ldc + first, ldc, depth);
  for (; r < rows; ++r) product_block<1, L>(a + r * lda, lda, b + first, ldb, c + r * ldc + first, ldc, depth);
}
#endif

void position_product(std::int64_t rows, std::int64_t columns, std::int64_t depth, const float* a, std::int64_t lda,
                      const float* b, float* c, std::int64_t ldc) {
#if defined(__AVX2__)
  if (depth >= 1 && depth <= kMaxBlockedChannels) {
    std::int64_t f = 0;
    for (; f + 2 * kLanes <= columns; f += 2 * kLanes) product_columns<2>(rows, f, a, lda, b, columns, c, ldc, depth);
    for (; f + kLanes <= columns; f += kLanes) product_columns<1>(rows, f, a, lda, b, columns, c, ldc, depth);
    for (; f < columns; ++f)  // fewer than eight columns left
      for (std::int64_t r = 0; r < rows; ++r) {
        float sum = 0.0f;
        for (std::int64_t k = 0; k < depth; ++k) sum += a[r * lda + k] * b[k * columns + f];
        c[r * ldc + f] = sum;
      }
    return;
  }
#endif
  gemm(false, false, rows, columns, depth, 1.0f, a, lda, b, columns, 0.0f, c, ldc);
}

#if defined(__AVX2__)
// The direct convolution of few input channels (the first layer's RGB): a stride-1 3x3 window over NHWC
// rows is, for each of its three kernel rows, a run of 3 C contiguous floats, so R output pixels x 8 L
// filters are R x L register accumulators over the 9 C taps, read straight from three zero-padded input rows.
template <int R, int L>
inline void direct_block(const float* const rows[3], std::int64_t channels, const float* kernel, std::int64_t filters,
                         const float* bias, bool relu, float* out) {
  Lanes sums[R][L];
  for (int l = 0; l < L; ++l) {
    const Lanes b = bias != nullptr ? load<Lanes>(bias + kLanes * l) : Lanes{};
    for (int r = 0; r < R; ++r) sums[r][l] = b;
  }
  const std::int64_t run = 3 * channels;
  for (int i = 0; i < 3; ++i)
    for (std::int64_t t = 0; t < run; ++t) {
      Lanes weights[L];
      for (int l = 0; l < L; ++l) weights[l] = load<Lanes>(kernel + (i * run + t) * filters + kLanes * l);
      for (int r = 0; r < R; ++r) {
        const float scalar = rows[i][r * channels + t];
        for (int l = 0; l < L; ++l) sums[r][l] += scalar * weights[l];
      }
    }
  for (int r = 0; r < R; ++r)
    for (int l = 0; l < L; ++l) store(out + r * filters + kLanes * l, relu ? positive_part(sums[r][l]) : sums[r][l]);
}

// One output row's pixels [0, width) for the filters [first, first + 8 L), six pixels at a time.
template <int L>
void direct_columns(const float* const rows[3], std::int64_t width, std::int64_t channels, std::int64_t first,
                    const float* kernel, std::int64_t filters, const float* bias, bool relu, float* out) {
  const float* b = bias != nullptr ? bias + first : nullptr;
  std::int64_t w = 0;
  for (; w + 6 <= width; w += 6) {
    const float* at[3] = {rows[0] + w * channels, rows[1] + w * channels, rows[2] + w * channels};
    direct_block<6, L>(at, channels, kernel + first, filters, b, relu, out + w * filters + first);
  }
  for (; w < width; ++w) {
    const float* at[3] = {rows[0] + w * channels, rows[1] + w * channels, rows[2] + w * channels};
    direct_block<1, L>(at, channels, kernel + first, filters, b, relu, out + w * filters + first);
  }
}

// The three input rows under output row n_h (= sample * out_h + row), zero-padded to every window's columns
// (out_w + 2 of them at stride 1), in the calling thread's scratch.
void padded_rows(const float* x, const Conv2dGeometry& g, std::int64_t n_h, const float* rows[3]) {
  const std::int64_t n = n_h / g.out_h, h = n_h % g.out_h;
  const std::int64_t padded_width = g.out_w + 2, row_floats = padded_width * g.in_c;
  float* padded = thread_scratch(ScratchSlot::PaddedRows, static_cast<std::size_t>(3 * row_floats));
  const std::int64_t first = larger(0, g.pad_left), last = smaller(padded_width, g.pad_left + g.in_w);
  for (int i = 0; i < 3; ++i) {
    float* row = padded + i * row_floats;
    std::memset(row, 0, sizeof(float) * row_floats);
    const std::int64_t ih = h - g.pad_top + i;
    if (ih >= 0 && ih < g.in_h && last > first)
      std::memcpy(row + first * g.in_c, x + ((n * g.in_h + ih) * g.in_w + first - g.pad_left) * g.in_c,
                  sizeof(float) * (last - first) * g.in_c);
    rows[i] = row;
  }
}

void direct_forward(const float* x, const float* kernel, const float* bias, bool relu, float* y, const Conv2dGeometry& g) {
  const std::int64_t c_count = g.in_c, f_count = g.out_c;
#pragma omp parallel for schedule(static)
  for (std::int64_t n_h = 0; n_h < g.batch * g.out_h; ++n_h) {
    const float* rows[3];
    padded_rows(x, g, n_h, rows);
    float* out = y + n_h * g.out_w * f_count;
    std::int64_t f = 0;
    for (; f + 2 * kLanes <= f_count; f += 2 * kLanes)
      direct_columns<2>(rows, g.out_w, c_count, f, kernel, f_count, bias, relu, out);
    for (; f + kLanes <= f_count; f += kLanes) direct_columns<1>(rows, g.out_w, c_count, f, kernel, f_count, bias, relu, out);
    for (; f < f_count; ++f)  // fewer than eight filters left
      for (std::int64_t w = 0; w < g.out_w; ++w) {
        float sum = bias != nullptr ? bias[f] : 0.0f;
        for (int i = 0; i < 3; ++i)
          for (std::int64_t t = 0; t < 3 * c_count; ++t)
            sum += rows[i][w * c_count + t] * kernel[(i * 3 * c_count + t) * f_count + f];
        out[w * f_count + f] = relu ? positive_part(sum) : sum;
      }
  }
}

// dkernel of the direct convolution: each thread sums over its output rows, for three taps (input values of
// one kernel row) x 8 L filters at a time, tap x dy products in registers, then adds them to its partial.
template <int L>
void direct_gradient_block(const float* tap_row, std::int64_t channels, const float* dy_row, std::int64_t width,
                           std::int64_t filters, float* partial) {
  if (width == 0) return;
  // Started from the first pixel's products, not zeros (see product_block).
  Lanes sums[3][L], gradients[L];
  for (int l = 0; l < L; ++l) gradients[l] = load<Lanes>(dy_row + kLanes * l);
  for (int t = 0; t < 3; ++t)
    for (int l = 0; l < L; ++l) sums[t][l] = tap_row[t] * gradients[l];
  for (std::int64_t w = 1; w < width; ++w) {
    for (int l = 0; l < L; ++l) gradients[l] = load<Lanes>(dy_row + w * filters + kLanes * l);
    for (int t = 0; t < 3; ++t) {
      const float value = tap_row[w * channels + t];
      for (int l = 0; l < L; ++l) sums[t][l] += value * gradients[l];
    }
  }
  for (int t = 0; t < 3; ++t)
    for (int l = 0; l < L; ++l) store(partial + t * filters + kLanes * l, load<Lanes>(partial + t * filters + kLanes * l) + sums[t][l]);
}

void direct_kernel_gradient(const float* x, const float* dy, float* dkernel, const Conv2dGeometry& g) {
  const std::int64_t c_count = g.in_c, f_count = g.out_c, taps = 9 * c_count;
  const int threads = omp_get_max_threads();
  float* partial = thread_scratch(ScratchSlot::Partials, static_cast<std::size_t>(threads * taps * f_count));
  std::memset(partial, 0, sizeof(float) * threads * taps * f_count);
#pragma omp parallel
  {
    float* mine = partial + omp_get_thread_num() * taps * f_count;
#pragma omp for schedule(static)
    for (std::int64_t n_h = 0; n_h < g.batch * g.out_h; ++n_h) {
      const float* rows[3];
      padded_rows(x, g, n_h, rows);
      const float* dy_row = dy + n_h * g.out_w * f_count;
      // Taps (i, t) in threes: 3 C taps per kernel row i.
      for (int i = 0; i < 3; ++i)
        for (std::int64_t t = 0; t < 3 * c_count; t += 3) {
          float* out = mine + (i * 3 * c_count + t) * f_count;
          std::int64_t f = 0;
          for (; f + 4 * kLanes <= f_count; f += 4 * kLanes)
            direct_gradient_block<4>(rows[i] + t, c_count, dy_row + f, g.out_w, f_count, out + f);
          for (; f + kLanes <= f_count; f += kLanes)
            direct_gradient_block<1>(rows[i] + t, c_count, dy_row + f, g.out_w, f_count, out + f);
          for (; f < f_count; ++f)  // fewer than eight filters left
            for (int k = 0; k < 3; ++k) {
              float sum = 0.0f;
              for (std::int64_t w = 0; w < g.out_w; ++w) sum += rows[i][w * c_count + t + k] * dy_row[w * f_count + f];
              out[k * f_count + f] += sum;
            }
        }
    }
  }
  sum_thread_partials(partial, threads, taps * f_count, dkernel);
}
#endif

// Runs block.template operator()<V>(channel) over [0, count): Lanes while eight channels remain, then float.
template <typename Block>
void over_channels(std::int64_t count, Block&& block) {
  std::int64_t channel = 0;
  for (; channel + kLanes <= count; channel += kLanes) block.template operator()<Lanes>(channel);
  for (; channel < count; ++channel) block.template operator()<float>(channel);
}

// Per-chunk scratch of the calling thread: the two transformed operands, a border patch, zeros to read
// past the output's edge and a sink to write there.
struct Scratch {
  float *a, *b, *patch, *zeros, *edge;
};

Scratch thread_scratch_for(const Conv2dGeometry& g, std::int64_t chunk, int positions, int alpha) {
  Scratch s{thread_scratch(ScratchSlot::TransformedInput, static_cast<std::size_t>(positions * chunk * g.in_c)),
            thread_scratch(ScratchSlot::TransformedOutput, static_cast<std::size_t>(positions * chunk * g.out_c)),
            thread_scratch(ScratchSlot::BorderPatch, static_cast<std::size_t>(alpha * alpha * g.in_c)),
            thread_scratch(ScratchSlot::EdgeZeros, static_cast<std::size_t>(g.out_c)),
            thread_scratch(ScratchSlot::EdgeSink, static_cast<std::size_t>(g.out_c))};
  std::memset(s.zeros, 0, sizeof(float) * g.out_c);
  return s;
}

template <int M>
struct Winograd {
  using T = Transforms<M>;
  static constexpr int kAlpha = T::kAlpha;
  static constexpr int kPositions = kAlpha * kAlpha;

  // Where each pixel of output tile `tile` lies in an NHWC tensor of the output's shape; pixels past the
  // bottom or right edge point at `outside` instead, which keeps the inner loops branch-free.
  template <typename Pointer>
  static void tile_pixels(const Conv2dGeometry& g, const Tiling& tl, std::int64_t tile, Pointer base, Pointer outside,
                          Pointer (&pixels)[M][M]) {
    const std::int64_t n = tile / tl.per_sample, within = tile % tl.per_sample;
    const std::int64_t h0 = (within / tl.tiles_w) * M, w0 = (within % tl.tiles_w) * M;
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < M; ++j)
        pixels[i][j] = h0 + i < g.out_h && w0 + j < g.out_w ? base + ((n * g.out_h + h0 + i) * g.out_w + w0 + j) * g.out_c
                                                            : outside;
  }

  // U[k][c][f] = (G g G^T)[k] for every input channel c and filter f, in the calling thread's scratch.
  static const float* transform_kernel(const float* kernel, const Conv2dGeometry& g) {
    const std::int64_t c_count = g.in_c, f_count = g.out_c;
    float* u = thread_scratch(ScratchSlot::TransformedKernel, static_cast<std::size_t>(kPositions * c_count * f_count));
#pragma omp parallel for schedule(static) if (c_count * f_count >= kParallelPairs)
    for (std::int64_t c = 0; c < c_count; ++c)
      for (std::int64_t f = 0; f < f_count; ++f) {
        float w[3][3], transformed[kAlpha][kAlpha];
        for (int i = 0; i < 3; ++i)
          for (int j = 0; j < 3; ++j) w[i][j] = kernel[((i * 3 + j) * c_count + c) * f_count + f];
        separable<3, kAlpha, float, T::template kernel<float>>(w, transformed);
        for (int k = 0; k < kPositions; ++k)
          u[(k * c_count + c) * f_count + f] = transformed[k / kAlpha][k % kAlpha];
      }
    return u;
  }

  // V[t][k][c] for the tiles [first, first + count): each tile's transformed rows are contiguous, and V[k]
  // is the (tiles x in_c) matrix with row stride kPositions x in_c. A tile's input rows are each one
  // contiguous run of kAlpha x in_c floats (NHWC); tiles at the border are first copied into `patch` with
  // zeros outside the image.
  static void transform_input(const float* x, const Conv2dGeometry& g, const Tiling& tl, std::int64_t first,
                              std::int64_t count, float* __restrict v, float* __restrict patch) {
    const std::int64_t c_count = g.in_c;
    for (std::int64_t t = 0; t < count; ++t) {
      const std::int64_t tile = first + t;
      const std::int64_t n = tile / tl.per_sample, within = tile % tl.per_sample;
      const std::int64_t h0 = (within / tl.tiles_w) * M - g.pad_top, w0 = (within % tl.tiles_w) * M - g.pad_left;
      const float* rows[kAlpha];
      if (h0 >= 0 && h0 + kAlpha <= g.in_h && w0 >= 0 && w0 + kAlpha <= g.in_w) {
        for (int i = 0; i < kAlpha; ++i) rows[i] = x + ((n * g.in_h + h0 + i) * g.in_w + w0) * c_count;
      } else {
        for (int i = 0; i < kAlpha; ++i) {
          rows[i] = patch + i * kAlpha * c_count;
          for (int j = 0; j < kAlpha; ++j) {
            float* dst = patch + (i * kAlpha + j) * c_count;
            const std::int64_t h = h0 + i, w = w0 + j;
            if (h < 0 || h >= g.in_h || w < 0 || w >= g.in_w) std::memset(dst, 0, sizeof(float) * c_count);
            else std::memcpy(dst, x + ((n * g.in_h + h) * g.in_w + w) * c_count, sizeof(float) * c_count);
          }
        }
      }
      float* __restrict out = v + t * kPositions * c_count;
      over_channels(c_count, [&]<typename V>(std::int64_t c) {
        V d[kAlpha][kAlpha], transformed[kAlpha][kAlpha];
        for (int i = 0; i < kAlpha; ++i)
          for (int j = 0; j < kAlpha; ++j) d[i][j] = load<V>(rows[i] + j * c_count + c);
        separable<kAlpha, kAlpha, V, T::template input<V>>(d, transformed);
        for (int k = 0; k < kPositions; ++k) store(out + k * c_count + c, transformed[k / kAlpha][k % kAlpha]);
      });
    }
  }

  // y tiles from M[t][k][f]: Y = A^T M A, plus bias, clipped at zero when `relu` and at the bottom and right
  // edges.
  static void transform_output(const float* m, const float* bias, bool relu, const Conv2dGeometry& g,
                               const Tiling& tl, std::int64_t first, std::int64_t count, float* y, float* edge) {
    const std::int64_t f_count = g.out_c;
    for (std::int64_t t = 0; t < count; ++t) {
      float* pixels[M][M];
      tile_pixels(g, tl, first + t, y, edge, pixels);
      const float* in = m + t * kPositions * f_count;
      over_channels(f_count, [&]<typename V>(std::int64_t f) {
        V s[kAlpha][kAlpha], o[M][M];
        for (int k = 0; k < kPositions; ++k) s[k / kAlpha][k % kAlpha] = load<V>(in + k * f_count + f);
        const V b = bias != nullptr ? load<V>(bias + f) : V{};
        separable<kAlpha, M, V, T::template output<V>>(s, o);
        for (int i = 0; i < M; ++i)
          for (int j = 0; j < M; ++j) {
            const V value = o[i][j] + b;
            store(pixels[i][j] + f, relu ? positive_part(value) : value);
          }
      });
    }
  }

  // dy tiles into Z[t][k][f] = (A dy A^T)[k], the adjoint of transform_output; past the edges dy reads
  // as `zeros`.
  static void transform_output_gradient(const float* dy, const Conv2dGeometry& g, const Tiling& tl, std::int64_t first,
                                        std::int64_t count, float* z, const float* zeros) {
    const std::int64_t f_count = g.out_c;
    for (std::int64_t t = 0; t < count; ++t) {
      const float* pixels[M][M];
      tile_pixels(g, tl, first + t, dy, zeros, pixels);
      float* out = z + t * kPositions * f_count;
      over_channels(f_count, [&]<typename V>(std::int64_t f) {
        V e[M][M], r[kAlpha][kAlpha];
        for (int i = 0; i < M; ++i)
          for (int j = 0; j < M; ++j) e[i][j] = load<V>(pixels[i][j] + f);
        separable<M, kAlpha, V, T::template output_gradient<V>>(e, r);
        for (int k = 0; k < kPositions; ++k) store(out + k * f_count + f, r[k / kAlpha][k % kAlpha]);
      });
    }
  }

  static std::int64_t tiles_per_chunk(const Conv2dGeometry& g, const Tiling& tl) {
    // At least kMinTiles rows per GEMM, so that packing the transformed kernel is amortized...
    const std::int64_t target = smaller(larger(kChunkFloats / (kPositions * (g.in_c + g.out_c)), kMinTiles),
                                        larger(tl.total, kMinTiles));
    // ...then evened out so that every thread gets the same number of equal chunks.
    const std::int64_t threads = omp_get_max_threads();
    const std::int64_t rounds = larger(1, (tl.total + target * threads - 1) / (target * threads));
    const std::int64_t chunks = rounds * threads;
    return larger(1, (tl.total + chunks - 1) / chunks);
  }

  static void forward(const float* x, const float* kernel, const float* bias, bool relu, float* y,
                      const Conv2dGeometry& g);
  static void kernel_gradient(const float* x, const float* dy, float* dkernel, const Conv2dGeometry& g);
};

// Runs body(first_tile, tile_count, thread) over chunks of `chunk` tiles: in parallel when there are
// enough chunks for every thread, else one after another (each GEMM then uses the threads).
template <typename Body>
void for_each_tile_chunk(std::int64_t total, std::int64_t chunk, Body&& body) {
  const std::int64_t chunks = (total + chunk - 1) / chunk;
  auto run = [&](std::int64_t i, int thread) { body(i * chunk, smaller(chunk, total - i * chunk), thread); };
  if (chunks < omp_get_max_threads()) {
    for (std::int64_t i = 0; i < chunks; ++i) run(i, 0);
    return;
  }
#pragma omp parallel
  {
    const int thread = omp_get_thread_num();
#pragma omp for schedule(static)
    for (std::int64_t i = 0; i < chunks; ++i) run(i, thread);
  }
}

template <int M>
void Winograd<M>::forward(const float* x, const float* kernel, const float* bias, bool relu, float* y,
                          const Conv2dGeometry& g) {
  const Tiling tl = tiling(g, M);
  if (tl.total == 0) return;
  const float* u = transform_kernel(kernel, g);
  const std::int64_t chunk = tiles_per_chunk(g, tl);
  for_each_tile_chunk(tl.total, chunk, [&](std::int64_t first, std::int64_t count, int) {
    const Scratch s = thread_scratch_for(g, chunk, kPositions, kAlpha);
    transform_input(x, g, tl, first, count, s.a, s.patch);
    for (int k = 0; k < kPositions; ++k)
      position_product(count, g.out_c, g.in_c, s.a + k * g.in_c, kPositions * g.in_c, u + k * g.in_c * g.out_c,
                       s.b + k * g.out_c, kPositions * g.out_c);
    transform_output(s.b, bias, relu, g, tl, first, count, y, s.edge);
  });
}

template <int M>
void Winograd<M>::kernel_gradient(const float* x, const float* dy, float* dkernel, const Conv2dGeometry& g) {
  const Tiling tl = tiling(g, M);
  const std::int64_t c_count = g.in_c, f_count = g.out_c;
  const std::int64_t chunk = tiles_per_chunk(g, tl);
  // dU[k] = sum over tiles of V[k]^T Z[k], summed per thread and reduced in thread order (repeatable).
  const std::int64_t per_thread = kPositions * c_count * f_count;
  const int threads = omp_get_max_threads();
  float* partial = thread_scratch(ScratchSlot::Partials, static_cast<std::size_t>(threads * per_thread));
  std::memset(partial, 0, sizeof(float) * threads * per_thread);
  for_each_tile_chunk(tl.total, chunk, [&](std::int64_t first, std::int64_t count, int thread) {
    const Scratch s = thread_scratch_for(g, chunk, kPositions, kAlpha);
    transform_input(x, g, tl, first, count, s.a, s.patch);
    transform_output_gradient(dy, g, tl, first, count, s.b, s.zeros);
    float* du = partial + thread * per_thread;
    for (int k = 0; k < kPositions; ++k)
      gemm(true, false, c_count, f_count, count, 1.0f, s.a + k * c_count, kPositions * c_count, s.b + k * f_count,
           kPositions * f_count, 1.0f, du + k * c_count * f_count, f_count);
  });
  // dg = G^T dU G for every (c, f), written in HWIO order, after the threads' partial sums are added.
#pragma omp parallel for schedule(static) if (c_count * f_count >= kParallelPairs)
  for (std::int64_t c = 0; c < c_count; ++c)
    for (std::int64_t f = 0; f < f_count; ++f) {
      float d[kAlpha][kAlpha], w[3][3];
      for (int k = 0; k < kPositions; ++k) {
        const std::int64_t at = (k * c_count + c) * f_count + f;
        float sum = partial[at];
        for (int t = 1; t < threads; ++t) sum += partial[t * per_thread + at];
        d[k / kAlpha][k % kAlpha] = sum;
      }
      separable<kAlpha, 3, float, T::template kernel_gradient<float>>(d, w);
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) dkernel[((i * 3 + j) * c_count + c) * f_count + f] = w[i][j];
    }
}

void forward(int tile, const float* x, const float* kernel, const float* bias, bool relu, float* y,
             const Conv2dGeometry& g) {
  if (tile == 4) Winograd<4>::forward(x, kernel, bias, relu, y, g);
  else Winograd<2>::forward(x, kernel, bias, relu, y, g);
}

void kernel_gradient(int tile, const float* x, const float* dy, float* dkernel, const Conv2dGeometry& g) {
  if (tile == 4) Winograd<4>::kernel_gradient(x, dy, dkernel, g);
  else Winograd<2>::kernel_gradient(x, dy, dkernel, g);
}

}  // namespace

const WinogradKernels& COHORT_WINOGRAD_KERNELS() {
#if defined(__AVX2__)
  static const WinogradKernels kernels{forward, kernel_gradient, direct_forward, direct_kernel_gradient};
#else
  static const WinogradKernels kernels{forward, kernel_gradient, nullptr, nullptr};
#endif
  return kernels;
}

}  // namespace cohort::cpu
