// Max and average pooling over NHWC tensors, parallel over samples. Windows are clipped to the input;
// max pooling sends the gradient to the first maximum of each window, as TensorFlow does.
#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu_backend.hpp"
#include "elements.hpp"
#include "tensor/backend_access.hpp"
#if COHORT_WINOGRAD_X86_VARIANTS
#include "avx512_passes.hpp"
#endif

namespace cohort::cpu {
namespace {

struct Window {
  std::int64_t h0, h1, w0, w1;
};

Window window(const Pool2dGeometry& g, std::int64_t oh, std::int64_t ow) {
  const std::int64_t h = oh * g.stride_h - g.pad_top;
  const std::int64_t w = ow * g.stride_w - g.pad_left;
  return {std::max<std::int64_t>(h, 0), std::min(h + g.pool_h, g.in_h), std::max<std::int64_t>(w, 0),
          std::min(w + g.pool_w, g.in_w)};
}

// Operands float32 or bfloat16 (elements.hpp); each window's maximum is one of its inputs, so it is exact.
template <class T>
void max_pool_forward(const Tensor& x, const Tensor& y, const Pool2dGeometry& g) {
  const std::int64_t c = g.channels;
  const Elements<T> in(x), out(y);
#pragma omp parallel
  {
    std::vector<float> window_max(static_cast<std::size_t>(c));
#pragma omp for
    for (std::int64_t n = 0; n < g.batch; ++n) {
      for (std::int64_t oh = 0; oh < g.out_h; ++oh) {
        for (std::int64_t ow = 0; ow < g.out_w; ++ow) {
          float* o = window_max.data();
          std::fill_n(o, c, -std::numeric_limits<float>::infinity());
          const Window win = window(g, oh, ow);
          for (std::int64_t ih = win.h0; ih < win.h1; ++ih) {
            for (std::int64_t iw = win.w0; iw < win.w1; ++iw) {
              const std::int64_t v = ((n * g.in_h + ih) * g.in_w + iw) * c;
#pragma omp simd
              for (std::int64_t i = 0; i < c; ++i) {
                const float value = in[v + i];  // a value, not std::max's reference to a temporary: it vectorizes
                o[i] = o[i] < value ? value : o[i];
              }
            }
          }
          const std::int64_t at = ((n * g.out_h + oh) * g.out_w + ow) * c;
#pragma omp simd
          for (std::int64_t i = 0; i < c; ++i) out.set(at + i, o[i]);
        }
      }
    }
  }
}

// Whether the windows tile the input without overlap or padding: each input pixel then lies in at most
// one window, whose gradient it receives by assignment, and only the pixels past the last window (the
// rows and columns a valid pooling drops) need zeros first.
bool windows_tile_input(const Pool2dGeometry& g) {
  return g.stride_h == g.pool_h && g.stride_w == g.pool_w && g.pad_top == 0 && g.pad_left == 0;
}

// Zeros what no window will write of one sample's input gradient (everything unless the windows tile it),
// as zero(first, count) on runs of the sample's elements.
template <class Zero>
void zero_uncovered(const Pool2dGeometry& g, bool tiled, Zero&& zero) {
  const std::int64_t c = g.channels;
  if (!tiled) {
    zero(0, g.in_h * g.in_w * c);
    return;
  }
  const std::int64_t covered_h = g.out_h * g.pool_h, covered_w = g.out_w * g.pool_w;
  for (std::int64_t ih = 0; ih < g.in_h; ++ih) {
    const std::int64_t row = ih * g.in_w * c;
    if (ih >= covered_h) zero(row, g.in_w * c);
    else zero(row + covered_w * c, (g.in_w - covered_w) * c);
  }
}

// Keras' default pooling: 2x2 windows at stride 2, none clipped. Each window's four pixels are read in one
// loop over the channels, in the order the general loops visit them.
bool two_by_two_tiles(const Pool2dGeometry& g) {
  return windows_tile_input(g) && g.pool_h == 2 && g.pool_w == 2 && 2 * g.out_h <= g.in_h && 2 * g.out_w <= g.in_w;
}

// Whether avx512_passes.hpp's 2x2 kernels run for this many channels.
bool avx512_pooling(std::int64_t channels) {
#if COHORT_WINOGRAD_X86_VARIANTS
  return avx512::run_for(channels);
#else
  (void)channels;
  return false;
#endif
}

template <class T>
void max_pool_2x2_forward(const Tensor& x, const Tensor& y, const Pool2dGeometry& g) {
  const std::int64_t c = g.channels, below = g.in_w * c;
#if COHORT_WINOGRAD_X86_VARIANTS
  if (avx512_pooling(c)) {
    const T* in = device_elements<T>(x);
    T* out = device_elements<T>(y);
#pragma omp parallel for
    for (std::int64_t n = 0; n < g.batch; ++n)
      avx512::max_pool_2x2_forward(in + n * g.in_h * below, g.in_w, c, g.out_h, g.out_w, out + n * g.out_h * g.out_w * c);
    return;
  }
#endif
#pragma omp parallel for
  for (std::int64_t n = 0; n < g.batch; ++n) {
    const Elements<T> in(x), out(y);  // each thread's own views, so that the loop vectorizes
    for (std::int64_t oh = 0; oh < g.out_h; ++oh)
      for (std::int64_t ow = 0; ow < g.out_w; ++ow) {
        const std::int64_t v = ((n * g.in_h + 2 * oh) * g.in_w + 2 * ow) * c;
        const std::int64_t at = ((n * g.out_h + oh) * g.out_w + ow) * c;
#pragma omp simd
        for (std::int64_t i = 0; i < c; ++i) {
          const float a = in[v + i], b = in[v + c + i], d = in[v + below + i], e = in[v + below + c + i];
          float m = -std::numeric_limits<float>::infinity();
          m = m < a ? a : m;
          m = m < b ? b : m;
          m = m < d ? d : m;
          m = m < e ? e : m;
          out.set(at + i, m);
        }
      }
  }
}

// The gradient goes to the first maximum of each window, the other three pixels get zeros: every value is
// one of dy's (plus 0, as the general loop adds it), so it is stored exactly in either type.
template <class T>
void max_pool_2x2_backward(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx, const Pool2dGeometry& g) {
  const std::int64_t c = g.channels, below = g.in_w * c, sample = g.in_h * g.in_w * c;
#pragma omp parallel for
  for (std::int64_t n = 0; n < g.batch; ++n) {
    const Elements<T> in(x), out(y), dout(dy), din(dx);
    zero_uncovered(g, true, [&](std::int64_t first, std::int64_t count) {
      for (std::int64_t j = first; j < first + count; ++j) din.set(n * sample + j, 0.0f);
    });
#if COHORT_WINOGRAD_X86_VARIANTS
    if (avx512_pooling(c)) {
      const std::int64_t pooled = g.out_h * g.out_w * c;
      avx512::max_pool_2x2_backward(device_elements<T>(x) + n * sample, device_elements<T>(y) + n * pooled,
                                    device_elements<T>(dy) + n * pooled, g.in_w, c, g.out_h, g.out_w,
                                    device_elements<T>(dx) + n * sample);
      continue;
    }
#endif
    for (std::int64_t oh = 0; oh < g.out_h; ++oh)
      for (std::int64_t ow = 0; ow < g.out_w; ++ow) {
        const std::int64_t v = ((n * g.in_h + 2 * oh) * g.in_w + 2 * ow) * c;
        const std::int64_t o = ((n * g.out_h + oh) * g.out_w + ow) * c;
#pragma omp simd
        for (std::int64_t i = 0; i < c; ++i) {
          const float maximum = out[o + i], gradient = dout[o + i];
          const bool a = in[v + i] == maximum;
          const bool b = !a & (in[v + c + i] == maximum);
          const bool d = !a & !b & (in[v + below + i] == maximum);
          const bool e = !a & !b & !d & (in[v + below + c + i] == maximum);
          din.set(v + i, 0.0f + (a ? gradient : 0.0f));
          din.set(v + c + i, 0.0f + (b ? gradient : 0.0f));
          din.set(v + below + i, 0.0f + (d ? gradient : 0.0f));
          din.set(v + below + c + i, 0.0f + (e ? gradient : 0.0f));
        }
      }
  }
}

// Operands float32 or bfloat16; a bfloat16 sample's gradient is summed in float and rounded once.
template <class T>
void max_pool_backward(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx, const Pool2dGeometry& g) {
  const std::int64_t c = g.channels;
  const bool tiled = windows_tile_input(g);
  constexpr bool kFloat = std::is_same_v<T, float>;
  const std::int64_t sample = g.in_h * g.in_w * c;
  const Elements<T> in(x), out(y), dout(dy), stored_din(dx);
#pragma omp parallel
  {
    // pending[i]: 1 until channel i's gradient has gone to a maximum of this window (floats, like the data,
    // so that the loop below vectorizes with selects of one width).
    std::vector<float> pending(static_cast<std::size_t>(c));
    std::vector<float> sample_gradient(static_cast<std::size_t>(kFloat ? 0 : sample));
#pragma omp for
    for (std::int64_t n = 0; n < g.batch; ++n) {
      float* din = kFloat ? device_data(dx) + n * sample : sample_gradient.data();
      zero_uncovered(g, tiled, [&](std::int64_t first, std::int64_t count) { std::fill_n(din + first, count, 0.0f); });
      for (std::int64_t oh = 0; oh < g.out_h; ++oh) {
        for (std::int64_t ow = 0; ow < g.out_w; ++ow) {
          const std::int64_t o = ((n * g.out_h + oh) * g.out_w + ow) * c;
          float* p = pending.data();
          std::fill_n(p, c, 1.0f);
          const Window win = window(g, oh, ow);
          for (std::int64_t ih = win.h0; ih < win.h1; ++ih)
            for (std::int64_t iw = win.w0; iw < win.w1; ++iw) {
              const std::int64_t v = ((n * g.in_h + ih) * g.in_w + iw) * c;
              float* dv = din + (ih * g.in_w + iw) * c;
#pragma omp simd
              for (std::int64_t i = 0; i < c; ++i) {
                // Every load unconditional and no short circuit: selects, no branches, so that it vectorizes.
                const float gradient = dout[o + i], still_pending = p[i];
                const bool take = (in[v + i] == out[o + i]) & (still_pending != 0.0f);
                dv[i] = (tiled ? 0.0f : dv[i]) + (take ? gradient : 0.0f);
                p[i] = take ? 0.0f : still_pending;
              }
            }
        }
      }
      if constexpr (!kFloat) {
#pragma omp simd
        for (std::int64_t j = 0; j < sample; ++j) stored_din.set(n * sample + j, din[j]);
      }
    }
  }
}

void avg_pool_forward(const Tensor& x, const Tensor& y, const Pool2dGeometry& g) {
  const std::int64_t c = g.channels;
#pragma omp parallel for
  for (std::int64_t n = 0; n < g.batch; ++n) {
    const float* in = device_data(x) + n * g.in_h * g.in_w * c;
    float* out = device_data(y) + n * g.out_h * g.out_w * c;
    for (std::int64_t oh = 0; oh < g.out_h; ++oh) {
      for (std::int64_t ow = 0; ow < g.out_w; ++ow) {
        float* o = out + (oh * g.out_w + ow) * c;
        std::fill_n(o, c, 0.0f);
        const Window win = window(g, oh, ow);
        for (std::int64_t ih = win.h0; ih < win.h1; ++ih)
          for (std::int64_t iw = win.w0; iw < win.w1; ++iw) {
            const float* v = in + (ih * g.in_w + iw) * c;
            for (std::int64_t i = 0; i < c; ++i) o[i] += v[i];
          }
        const float inverse = 1.0f / static_cast<float>((win.h1 - win.h0) * (win.w1 - win.w0));
        for (std::int64_t i = 0; i < c; ++i) o[i] *= inverse;
      }
    }
  }
}

void avg_pool_backward(const Tensor& dy, const Tensor& dx, const Pool2dGeometry& g) {
  const std::int64_t c = g.channels;
#pragma omp parallel for
  for (std::int64_t n = 0; n < g.batch; ++n) {
    float* din = device_data(dx) + n * g.in_h * g.in_w * c;
    const float* dout = device_data(dy) + n * g.out_h * g.out_w * c;
    std::fill_n(din, g.in_h * g.in_w * c, 0.0f);
    for (std::int64_t oh = 0; oh < g.out_h; ++oh) {
      for (std::int64_t ow = 0; ow < g.out_w; ++ow) {
        const float* d = dout + (oh * g.out_w + ow) * c;
        const Window win = window(g, oh, ow);
        const float inverse = 1.0f / static_cast<float>((win.h1 - win.h0) * (win.w1 - win.w0));
        for (std::int64_t ih = win.h0; ih < win.h1; ++ih)
          for (std::int64_t iw = win.w0; iw < win.w1; ++iw) {
            float* v = din + (ih * g.in_w + iw) * c;
            for (std::int64_t i = 0; i < c; ++i) v[i] += d[i] * inverse;
          }
      }
    }
  }
}

}  // namespace

void CpuBackend::pool2d_forward(const PlanState*, const Pool2dGeometry& g, const Tensor& x, const Tensor& y) {
  if (g.mode != PoolMode::Max) return avg_pool_forward(x, y, g);  // float32 only (ops.cpp)
  with_stored(x.dtype(), [&](auto stored) {
    using T = decltype(stored);
    if (two_by_two_tiles(g)) max_pool_2x2_forward<T>(x, y, g);
    else max_pool_forward<T>(x, y, g);
  });
}

void CpuBackend::pool2d_backward(const PlanState*, const Pool2dGeometry& g, const Tensor& x, const Tensor& y,
                                 const Tensor& dy, const Tensor& dx) {
  if (g.mode != PoolMode::Max) return avg_pool_backward(dy, dx, g);  // float32 only (ops.cpp)
  with_stored(x.dtype(), [&](auto stored) {
    using T = decltype(stored);
    if (two_by_two_tiles(g)) max_pool_2x2_backward<T>(x, y, dy, dx, g);
    else max_pool_backward<T>(x, y, dy, dx, g);
  });
}

}  // namespace cohort::cpu
