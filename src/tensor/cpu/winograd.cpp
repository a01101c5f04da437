// Winograd F(2x2, 3x3) (Lavin and Gray, 2015) for NHWC tensors.
//
// Each 2x2 block of output pixels ("tile") is computed from the 4x4 input patch under it. With the
// transforms V = B^T d B (input patch), U = G g G^T (kernel) and Y = A^T M A (output), the 3x3
// convolution becomes sixteen independent products M[k] = V[k] * U[k], one per position k of the 4x4
// transformed patch, each a GEMM of (tiles x in_channels) by (in_channels x out_channels). That is
// 16 multiply-adds per tile and channel pair instead of 36, a 2.25x cut in arithmetic, for a few
// additions per value in the transforms. Transformed data is laid out tile-major ([tile][k][channel]) so
// that the transforms read and write contiguous runs; each GEMM reads its k with a row stride. Tiles are processed in chunks whose transformed inputs and
// products fit in the cache, chunks spread over threads; chunks write disjoint output tiles.
#include "winograd.hpp"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu_backend.hpp"

namespace cohort::cpu {
namespace {

constexpr int kPositions = 16;
constexpr std::int64_t kChunkFloats = 1 << 18;  // about 1 MiB of transformed data per chunk
constexpr std::int64_t kMinTiles = 256;

struct Tiling {
  std::int64_t tiles_h, tiles_w, per_sample, total;
};

Tiling tiling(const Conv2dGeometry& g) {
  const std::int64_t th = (g.out_h + 1) / 2, tw = (g.out_w + 1) / 2;
  return {th, tw, th * tw, g.batch * th * tw};
}

// Where output tile `tile` starts in y (NHWC), and whether its second row and column exist.
struct OutputTile {
  std::int64_t offset;
  bool full_h, full_w;
};

OutputTile output_tile(const Conv2dGeometry& g, const Tiling& tl, std::int64_t tile) {
  const std::int64_t n = tile / tl.per_sample, within = tile % tl.per_sample;
  const std::int64_t h0 = (within / tl.tiles_w) * 2, w0 = (within % tl.tiles_w) * 2;
  return {((n * g.out_h + h0) * g.out_w + w0) * g.out_c, h0 + 1 < g.out_h, w0 + 1 < g.out_w};
}

// U[k][c][f] = (G g G^T)[k] for every input channel c and filter f.
std::vector<float> transform_kernel(const float* kernel, const Conv2dGeometry& g) {
  const std::int64_t c_count = g.in_c, f_count = g.out_c;
  std::vector<float> u(static_cast<std::size_t>(kPositions * c_count * f_count));
  for (std::int64_t c = 0; c < c_count; ++c)
    for (std::int64_t f = 0; f < f_count; ++f) {
      float w[3][3];
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) w[i][j] = kernel[((i * 3 + j) * c_count + c) * f_count + f];
      float t[4][3];  // G w
      for (int j = 0; j < 3; ++j) {
        t[0][j] = w[0][j];
        t[1][j] = 0.5f * (w[0][j] + w[1][j] + w[2][j]);
        t[2][j] = 0.5f * (w[0][j] - w[1][j] + w[2][j]);
        t[3][j] = w[2][j];
      }
      for (int i = 0; i < 4; ++i) {  // (G w) G^T
        const float r[4] = {t[i][0], 0.5f * (t[i][0] + t[i][1] + t[i][2]), 0.5f * (t[i][0] - t[i][1] + t[i][2]), t[i][2]};
        for (int j = 0; j < 4; ++j) u[static_cast<std::size_t>(((i * 4 + j) * c_count + c) * f_count + f)] = r[j];
      }
    }
  return u;
}

// V[t][k][c] for the tiles [first, first + count) of the batch: each tile's sixteen transformed rows are
// contiguous, and V[k] is the (tiles x in_c) matrix with row stride 16 x in_c. A tile's four input rows are each one
// contiguous run of 4 x in_c floats (NHWC); tiles at the border are first copied into `patch`
// (16 x in_c floats) with zeros outside the image.
void transform_input(const float* x, const Conv2dGeometry& g, const Tiling& tl, std::int64_t first, std::int64_t count,
                     float* __restrict v, float* __restrict patch) {
  const std::int64_t c_count = g.in_c;
  const std::int64_t position_stride = c_count;
  for (std::int64_t t = 0; t < count; ++t) {
    const std::int64_t tile = first + t;
    const std::int64_t n = tile / tl.per_sample, within = tile % tl.per_sample;
    const std::int64_t h0 = (within / tl.tiles_w) * 2 - g.pad_top, w0 = (within % tl.tiles_w) * 2 - g.pad_left;
    const float* rows[4];
    if (h0 >= 0 && h0 + 4 <= g.in_h && w0 >= 0 && w0 + 4 <= g.in_w) {
      for (int i = 0; i < 4; ++i) rows[i] = x + ((n * g.in_h + h0 + i) * g.in_w + w0) * c_count;
    } else {
      for (int i = 0; i < 4; ++i) {
        rows[i] = patch + i * 4 * c_count;
        for (int j = 0; j < 4; ++j) {
          float* dst = patch + (i * 4 + j) * c_count;
          const std::int64_t h = h0 + i, w = w0 + j;
          if (h < 0 || h >= g.in_h || w < 0 || w >= g.in_w) std::memset(dst, 0, sizeof(float) * c_count);
          else std::memcpy(dst, x + ((n * g.in_h + h) * g.in_w + w) * c_count, sizeof(float) * c_count);
        }
      }
    }
    const float* __restrict r0 = rows[0];
    const float* __restrict r1 = rows[1];
    const float* __restrict r2 = rows[2];
    const float* __restrict r3 = rows[3];
    float* __restrict out = v + t * kPositions * c_count;
#pragma omp simd
    for (std::int64_t c = 0; c < c_count; ++c) {
      float r[4][4];  // B^T d, column j at offset j * in_c of each row
      for (int j = 0; j < 4; ++j) {
        const std::int64_t at = j * c_count + c;
        r[0][j] = r0[at] - r2[at];
        r[1][j] = r1[at] + r2[at];
        r[2][j] = r2[at] - r1[at];
        r[3][j] = r1[at] - r3[at];
      }
      for (int i = 0; i < 4; ++i) {  // (B^T d) B
        out[(i * 4 + 0) * position_stride + c] = r[i][0] - r[i][2];
        out[(i * 4 + 1) * position_stride + c] = r[i][1] + r[i][2];
        out[(i * 4 + 2) * position_stride + c] = r[i][2] - r[i][1];
        out[(i * 4 + 3) * position_stride + c] = r[i][1] - r[i][3];
      }
    }
  }
}

// y tiles from M[t][k][f]: Y = A^T M A, plus bias, clipped at the bottom and right edges. `edge` is
// scratch of out_c floats: pixels past the edge are written there, which keeps the inner loop branch-free.
void transform_output(const float* m, const float* bias, const Conv2dGeometry& g, const Tiling& tl, std::int64_t first,
                      std::int64_t count, float* y, float* edge) {
  const std::int64_t f_count = g.out_c;
  const std::int64_t position_stride = f_count;
  for (std::int64_t t = 0; t < count; ++t) {
    const auto [offset, full_h, full_w] = output_tile(g, tl, first + t);
    float* out00 = y + offset;
    float* out01 = full_w ? out00 + f_count : edge;
    float* out10 = full_h ? out00 + g.out_w * f_count : edge;
    float* out11 = full_h && full_w ? out00 + (g.out_w + 1) * f_count : edge;
    const float* in = m + t * kPositions * f_count;
#pragma omp simd
    for (std::int64_t f = 0; f < f_count; ++f) {
      float s[4][4];
      for (int k = 0; k < kPositions; ++k) s[k / 4][k % 4] = in[k * position_stride + f];
      float r[2][4];  // A^T s
      for (int j = 0; j < 4; ++j) {
        r[0][j] = s[0][j] + s[1][j] + s[2][j];
        r[1][j] = s[1][j] - s[2][j] - s[3][j];
      }
      const float b = bias != nullptr ? bias[f] : 0.0f;
      out00[f] = r[0][0] + r[0][1] + r[0][2] + b;
      out01[f] = r[0][1] - r[0][2] - r[0][3] + b;
      out10[f] = r[1][0] + r[1][1] + r[1][2] + b;
      out11[f] = r[1][1] - r[1][2] - r[1][3] + b;
    }
  }
}

// dy tiles into Z[t][k][f] = (A dy A^T)[k], the adjoint of transform_output; past the edges dy reads as
// `zeros` (out_c floats), which keeps the inner loop branch-free.
void transform_output_gradient(const float* dy, const Conv2dGeometry& g, const Tiling& tl, std::int64_t first,
                               std::int64_t count, float* z, const float* zeros) {
  const std::int64_t f_count = g.out_c;
  const std::int64_t position_stride = f_count;
  for (std::int64_t t = 0; t < count; ++t) {
    const auto [offset, full_h, full_w] = output_tile(g, tl, first + t);
    const float* in00 = dy + offset;
    const float* in01 = full_w ? in00 + f_count : zeros;
    const float* in10 = full_h ? in00 + g.out_w * f_count : zeros;
    const float* in11 = full_h && full_w ? in00 + (g.out_w + 1) * f_count : zeros;
    float* out = z + t * kPositions * f_count;
#pragma omp simd
    for (std::int64_t f = 0; f < f_count; ++f) {
      const float e[2][2] = {{in00[f], in01[f]}, {in10[f], in11[f]}};
      float r[4][2];  // A e
      for (int b = 0; b < 2; ++b) {
        r[0][b] = e[0][b];
        r[1][b] = e[0][b] + e[1][b];
        r[2][b] = e[0][b] - e[1][b];
        r[3][b] = -e[1][b];
      }
      for (int i = 0; i < 4; ++i) {  // (A e) A^T
        out[(i * 4 + 0) * position_stride + f] = r[i][0];
        out[(i * 4 + 1) * position_stride + f] = r[i][0] + r[i][1];
        out[(i * 4 + 2) * position_stride + f] = r[i][0] - r[i][1];
        out[(i * 4 + 3) * position_stride + f] = -r[i][1];
      }
    }
  }
}

// Runs body(chunk_index, first_tile, tile_count, thread) over chunks of `chunk` tiles: in parallel when
// there are enough chunks for every thread, else one after another (each GEMM then uses the threads).
template <typename Body>
void for_each_tile_chunk(std::int64_t total, std::int64_t chunk, Body&& body) {
  const std::int64_t chunks = (total + chunk - 1) / chunk;
  auto run = [&](std::int64_t i, int thread) { body(i * chunk, std::min(chunk, total - i * chunk), thread); };
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

std::int64_t tiles_per_chunk(const Conv2dGeometry& g, const Tiling& tl) {
  // At least kMinTiles rows per GEMM, so that packing the transformed kernel is amortized...
  const std::int64_t target =
      std::clamp<std::int64_t>(kChunkFloats / (kPositions * (g.in_c + g.out_c)), kMinTiles, std::max<std::int64_t>(tl.total, kMinTiles));
  // ...then evened out so that every thread gets the same number of equal chunks.
  const std::int64_t threads = omp_get_max_threads();
  const std::int64_t rounds = std::max<std::int64_t>(1, (tl.total + target * threads - 1) / (target * threads));
  const std::int64_t chunks = rounds * threads;
  return std::max<std::int64_t>(1, (tl.total + chunks - 1) / chunks);
}

// Per-thread scratch buffers, allocated once per call.
// Per-thread scratch: the two transformed operands, a border patch, zeros to read and a sink to write.
struct Scratch {
  std::vector<float> a, b, patch, zeros, edge;
};

std::vector<Scratch> scratch_per_thread(const Conv2dGeometry& g, std::int64_t chunk) {
  std::vector<Scratch> scratch(static_cast<std::size_t>(omp_get_max_threads()));
  for (auto& s : scratch)
    s = {std::vector<float>(static_cast<std::size_t>(kPositions * chunk * g.in_c)),
         std::vector<float>(static_cast<std::size_t>(kPositions * chunk * g.out_c)),
         std::vector<float>(static_cast<std::size_t>(kPositions * g.in_c)),
         std::vector<float>(static_cast<std::size_t>(g.out_c), 0.0f),
         std::vector<float>(static_cast<std::size_t>(g.out_c))};
  return scratch;
}

}  // namespace

bool winograd_applies(const Conv2dGeometry& g) {
  return g.kernel_h == 3 && g.kernel_w == 3 && g.stride_h == 1 && g.stride_w == 1 && g.in_c >= 8 && g.out_c >= 8;
}

void winograd_conv3x3(const float* x, const float* kernel, const float* bias, float* y, const Conv2dGeometry& g) {
  const Tiling tl = tiling(g);
  if (tl.total == 0) return;
  const std::vector<float> u = transform_kernel(kernel, g);
  const std::int64_t chunk = tiles_per_chunk(g, tl);
  auto scratch = scratch_per_thread(g, chunk);
  for_each_tile_chunk(tl.total, chunk, [&](std::int64_t first, std::int64_t count, int thread) {
    Scratch& s = scratch[static_cast<std::size_t>(thread)];
    float* v = s.a.data();
    float* m = s.b.data();
    transform_input(x, g, tl, first, count, v, s.patch.data());
    for (int k = 0; k < kPositions; ++k)
      gemm(false, false, count, g.out_c, g.in_c, 1.0f, v + k * g.in_c, kPositions * g.in_c,
           u.data() + k * g.in_c * g.out_c, g.out_c, 0.0f, m + k * g.out_c, kPositions * g.out_c);
    transform_output(m, bias, g, tl, first, count, y, s.edge.data());
  });
}

void winograd_conv3x3_kernel_gradient(const float* x, const float* dy, float* dkernel, const Conv2dGeometry& g) {
  const Tiling tl = tiling(g);
  const std::int64_t c_count = g.in_c, f_count = g.out_c;
  const std::int64_t chunk = tiles_per_chunk(g, tl);
  auto scratch = scratch_per_thread(g, chunk);
  // dU[k] = sum over tiles of V[k]^T Z[k], summed per thread and reduced in thread order (repeatable).
  std::vector<std::vector<float>> partial(scratch.size(), std::vector<float>(static_cast<std::size_t>(kPositions * c_count * f_count), 0.0f));
  for_each_tile_chunk(tl.total, chunk, [&](std::int64_t first, std::int64_t count, int thread) {
    Scratch& s = scratch[static_cast<std::size_t>(thread)];
    float* v = s.a.data();
    float* z = s.b.data();
    transform_input(x, g, tl, first, count, v, s.patch.data());
    transform_output_gradient(dy, g, tl, first, count, z, s.zeros.data());
    float* du = partial[static_cast<std::size_t>(thread)].data();
    for (int k = 0; k < kPositions; ++k)
      gemm(true, false, c_count, f_count, count, 1.0f, v + k * c_count, kPositions * c_count, z + k * f_count,
           kPositions * f_count, 1.0f, du + k * c_count * f_count, f_count);
  });
  std::vector<float>& du = partial[0];
  for (std::size_t t = 1; t < partial.size(); ++t)
    for (std::size_t i = 0; i < du.size(); ++i) du[i] += partial[t][i];
  // dg = G^T dU G for every (c, f), written in HWIO order.
  for (std::int64_t c = 0; c < c_count; ++c)
    for (std::int64_t f = 0; f < f_count; ++f) {
      float d[4][4];
      for (int k = 0; k < kPositions; ++k) d[k / 4][k % 4] = du[static_cast<std::size_t>((k * c_count + c) * f_count + f)];
      float t[3][4];  // G^T dU
      for (int l = 0; l < 4; ++l) {
        t[0][l] = d[0][l] + 0.5f * (d[1][l] + d[2][l]);
        t[1][l] = 0.5f * (d[1][l] - d[2][l]);
        t[2][l] = 0.5f * (d[1][l] + d[2][l]) + d[3][l];
      }
      for (int i = 0; i < 3; ++i) {  // (G^T dU) G
        const float row[3] = {t[i][0] + 0.5f * (t[i][1] + t[i][2]), 0.5f * (t[i][1] - t[i][2]),
                              0.5f * (t[i][1] + t[i][2]) + t[i][3]};
        for (int j = 0; j < 3; ++j) dkernel[((i * 3 + j) * c_count + c) * f_count + f] = row[j];
      }
    }
}

void winograd_conv3x3_data_gradient(const float* dy, const float* kernel, float* dx, const Conv2dGeometry& g) {
  // dx[h, w, c] = sum over (i, j, f) of dy[h + pad_top - i, w + pad_left - j, f] * kernel[i, j, c, f]: a
  // convolution of dy with kernel'[i', j', f, c] = kernel[2 - i', 2 - j', c, f] and padding 2 - pad.
  std::vector<float> rotated(static_cast<std::size_t>(9 * g.in_c * g.out_c));
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      for (std::int64_t c = 0; c < g.in_c; ++c)
        for (std::int64_t f = 0; f < g.out_c; ++f)
          rotated[static_cast<std::size_t>(((i * 3 + j) * g.out_c + f) * g.in_c + c)] =
              kernel[(((2 - i) * 3 + (2 - j)) * g.in_c + c) * g.out_c + f];
  const Conv2dGeometry adjoint{g.batch, g.out_h, g.out_w, g.out_c, g.in_h, g.in_w, g.in_c, 3, 3, 1, 1,
                               2 - g.pad_top, 2 - g.pad_left};
  winograd_conv3x3(dy, rotated.data(), nullptr, dx, adjoint);
}

}  // namespace cohort::cpu
