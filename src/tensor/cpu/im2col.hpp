#pragma once
// The im2col matrix of one NHWC sample: one row per output pixel (oh, ow), holding the kernel_h x kernel_w x
// in_c input window in (kh, kw, c) order, zeros where the window leaves the input. With channels last each
// row is built from contiguous channel runs, and the product col x kernel (HWIO) is already the NHWC output.
#include <cstdint>
#include <cstring>

#include "cohort/tensor/geometry.hpp"

namespace cohort::cpu {

inline std::int64_t taps(const Conv2dGeometry& g) { return g.kernel_h * g.kernel_w * g.in_c; }

// Writes the rows of the output pixels [first, first + count) (row-major over out_h x out_w) at `col`,
// `row_stride` elements apart (taps(g) at least); T is float or bfloat16's bits.
template <class T>
void im2col(const T* x, const Conv2dGeometry& g, T* col, std::int64_t row_stride, std::int64_t first, std::int64_t count) {
  const std::int64_t c = g.in_c;
  const std::int64_t span = g.kernel_w * c;
  for (std::int64_t pixel = first; pixel < first + count; ++pixel) {
    const std::int64_t oh = pixel / g.out_w, ow = pixel % g.out_w;
    T* row = col + (pixel - first) * row_stride;
    const std::int64_t iw0 = ow * g.stride_w - g.pad_left;
    const bool columns_inside = iw0 >= 0 && iw0 + g.kernel_w <= g.in_w;
    for (std::int64_t kh = 0; kh < g.kernel_h; ++kh) {
      const std::int64_t ih = oh * g.stride_h - g.pad_top + kh;
      T* dst = row + kh * span;
      if (ih < 0 || ih >= g.in_h) {
        std::memset(dst, 0, sizeof(T) * span);
        continue;
      }
      const T* src_row = x + ih * g.in_w * c;
      if (columns_inside) {
        std::memcpy(dst, src_row + iw0 * c, sizeof(T) * span);
        continue;
      }
      for (std::int64_t kw = 0; kw < g.kernel_w; ++kw) {
        const std::int64_t iw = iw0 + kw;
        if (iw < 0 || iw >= g.in_w) std::memset(dst + kw * c, 0, sizeof(T) * c);
        else std::memcpy(dst + kw * c, src_row + iw * c, sizeof(T) * c);
      }
    }
  }
}

// The rows of all the sample's output pixels.
template <class T>
void im2col(const T* x, const Conv2dGeometry& g, T* col, std::int64_t row_stride) {
  im2col(x, g, col, row_stride, 0, g.out_h * g.out_w);
}

}  // namespace cohort::cpu
