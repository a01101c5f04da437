// The CPU ops against direct, obviously-correct reference loops, over shapes that do not divide evenly.
#include <catch2/catch.hpp>
#include <cmath>
#include <utility>

#include "cohort/core/error.hpp"
#include "cohort/core/parallel.hpp"
#include "cohort/tensor/ops.hpp"
#include "tensor/cpu/onednn.hpp"
#include "tensor/cpu/winograd.hpp"
#include "test_util.hpp"

using namespace cohort;
using test_util::max_abs_difference;
using test_util::random_tensor;

namespace {

Tensor reference_matmul(const Tensor& a, bool ta, const Tensor& b, bool tb) {
  const std::int64_t m = ta ? a.dim(1) : a.dim(0), k = ta ? a.dim(0) : a.dim(1), n = tb ? b.dim(0) : b.dim(1);
  Tensor c({m, n});
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t p = 0; p < k; ++p)
        s += static_cast<double>(ta ? a.data()[p * m + i] : a.data()[i * k + p]) * (tb ? b.data()[j * k + p] : b.data()[p * n + j]);
      c.data()[i * n + j] = static_cast<float>(s);
    }
  return c;
}

Tensor reference_conv(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dGeometry& g) {
  Tensor y({g.batch, g.out_h, g.out_w, g.out_c});
  for (std::int64_t n = 0; n < g.batch; ++n)
    for (std::int64_t oh = 0; oh < g.out_h; ++oh)
      for (std::int64_t ow = 0; ow < g.out_w; ++ow)
        for (std::int64_t f = 0; f < g.out_c; ++f) {
          double s = bias.defined() ? bias.data()[f] : 0.0;
          for (std::int64_t kh = 0; kh < g.kernel_h; ++kh)
            for (std::int64_t kw = 0; kw < g.kernel_w; ++kw) {
              const std::int64_t ih = oh * g.stride_h - g.pad_top + kh, iw = ow * g.stride_w - g.pad_left + kw;
              if (ih < 0 || ih >= g.in_h || iw < 0 || iw >= g.in_w) continue;
              for (std::int64_t c = 0; c < g.in_c; ++c)
                s += static_cast<double>(x.data()[((n * g.in_h + ih) * g.in_w + iw) * g.in_c + c]) *
                     w.data()[((kh * g.kernel_w + kw) * g.in_c + c) * g.out_c + f];
            }
          y.data()[((n * g.out_h + oh) * g.out_w + ow) * g.out_c + f] = static_cast<float>(s);
        }
  return y;
}

// The data and kernel gradients of a 3x3 convolution by direct loops: {dL/dx, dL/dw}.
std::pair<Tensor, Tensor> reference_conv_gradients(const Tensor& x, const Tensor& w, const Tensor& dy, const Conv2dGeometry& g) {
  Tensor dx(x.shape()), dw(w.shape());
  for (std::int64_t n = 0; n < g.batch; ++n)
    for (std::int64_t oh = 0; oh < g.out_h; ++oh)
      for (std::int64_t ow = 0; ow < g.out_w; ++ow)
        for (std::int64_t kh = 0; kh < 3; ++kh)
          for (std::int64_t kw = 0; kw < 3; ++kw) {
            const std::int64_t ih = oh * g.stride_h - g.pad_top + kh, iw = ow * g.stride_w - g.pad_left + kw;
            if (ih < 0 || ih >= g.in_h || iw < 0 || iw >= g.in_w) continue;
            for (std::int64_t c = 0; c < g.in_c; ++c)
              for (std::int64_t f = 0; f < g.out_c; ++f) {
                const float grad = dy.data()[((n * g.out_h + oh) * g.out_w + ow) * g.out_c + f];
                const std::int64_t xi = ((n * g.in_h + ih) * g.in_w + iw) * g.in_c + c;
                const std::int64_t wi = ((kh * 3 + kw) * g.in_c + c) * g.out_c + f;
                dx.data()[xi] += grad * w.data()[wi];
                dw.data()[wi] += grad * x.data()[xi];
              }
          }
  return {dx, dw};
}

Conv2dGeometry conv_geometry(std::int64_t batch, std::int64_t h, std::int64_t w, std::int64_t c, std::int64_t f,
                             std::int64_t k, std::int64_t stride, bool same) {
  Conv2dGeometry g{batch, h, w, c, 0, 0, f, k, k, stride, stride, 0, 0};
  if (same) {
    g.out_h = (h + stride - 1) / stride;
    g.out_w = (w + stride - 1) / stride;
    g.pad_top = std::max<std::int64_t>((g.out_h - 1) * stride + k - h, 0) / 2;
    g.pad_left = std::max<std::int64_t>((g.out_w - 1) * stride + k - w, 0) / 2;
  } else {
    g.out_h = (h - k) / stride + 1;
    g.out_w = (w - k) / stride + 1;
  }
  return g;
}

}  // namespace

TEST_CASE("matmul matches the reference for every transpose combination and GEMM path", "[ops]") {
  test_util::for_each_gemm_path([](GemmPath path) {
    INFO("GEMM path " << gemm_path_name(path));
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const std::int64_t m = 7, k = 13, n = 5;
        const Tensor a = random_tensor(ta ? Shape{k, m} : Shape{m, k}, 1);
        const Tensor b = random_tensor(tb ? Shape{n, k} : Shape{k, n}, 2);
        Tensor c = Tensor::full({m, n}, std::nanf(""));  // beta = 0 never reads c
        ops::matmul(a, ta, b, tb, c);
        CHECK(max_abs_difference(c, reference_matmul(a, ta, b, tb)) < 1e-5f);
        // beta accumulates onto c
        const Tensor before = c.clone();
        ops::matmul(a, ta, b, tb, c, 2.0f, 0.5f);
        const Tensor expected = reference_matmul(a, ta, b, tb);
        for (std::int64_t i = 0; i < c.numel(); ++i)
          CHECK(c.data()[i] == Approx(0.5f * before.data()[i] + 2 * expected.data()[i]).margin(1e-4));
      }
    // An empty inner dimension: c = beta * c
    Tensor c = Tensor::full({2, 3}, 4.0f);
    ops::matmul(Tensor({2, 0}), false, Tensor({0, 3}), false, c, 1.0f, 0.5f);
    CHECK(c.data()[5] == 2.0f);
  });
  Tensor bad({3, 3});
  CHECK_THROWS_AS(ops::matmul(Tensor({2, 3}), false, Tensor({2, 3}), false, bad), InvalidArgument);
  if (available_gemm_paths().size() == 1) CHECK_THROWS_AS(set_gemm_path(GemmPath::OpenBlas), InvalidArgument);
}

TEST_CASE("conv2d forward matches direct convolution over odd shapes, strides, padding and chunking", "[ops][conv]") {
  struct Case {
    std::int64_t batch, h, w, c, f, k, stride;
    bool same;
  };
  const Case cases[] = {{1, 5, 5, 1, 1, 3, 1, true},   {3, 7, 6, 3, 4, 3, 1, false}, {2, 8, 8, 2, 5, 3, 2, true},
                        {2, 9, 7, 3, 2, 2, 2, true},   {5, 4, 4, 3, 3, 1, 1, false}, {40, 3, 3, 2, 3, 3, 1, true},
                        {2, 6, 6, 4, 3, 5, 1, true},   {1, 3, 3, 2, 2, 3, 1, false}, {70, 5, 5, 3, 4, 3, 2, false},
                        // Winograd geometries: odd output sizes, one-pixel images, many chunks
                        {3, 9, 7, 8, 9, 3, 1, true},   {2, 6, 5, 16, 8, 3, 1, false}, {1, 1, 1, 8, 8, 3, 1, true},
                        {130, 4, 4, 8, 12, 3, 1, true}, {2, 3, 3, 8, 8, 3, 1, false}};
  // The backend's own kernels, and oneDNN's where it can run them (the default on processors with AMX).
  const bool default_forward = cpu::onednn::float32_forward_convolutions();
  std::vector<bool> onednn_forward{false};
  try {
    cpu::onednn::set_float32_forward_convolutions(true);
    onednn_forward.push_back(true);
  } catch (const InvalidArgument&) {
  }
  for (const bool onednn : onednn_forward) {
    cpu::onednn::set_float32_forward_convolutions(onednn);
    test_util::for_each_gemm_path([&](GemmPath path) {
      for (const Case& t : cases) {
        INFO("GEMM path " << gemm_path_name(path) << (onednn ? ", forward on oneDNN" : ""));
        const Conv2dGeometry g = conv_geometry(t.batch, t.h, t.w, t.c, t.f, t.k, t.stride, t.same);
        Conv2dPlan plan(g, Device::CPU);
        const Tensor x = random_tensor({g.batch, g.in_h, g.in_w, g.in_c}, 3);
        const Tensor w = random_tensor({g.kernel_h, g.kernel_w, g.in_c, g.out_c}, 4);
        const Tensor bias = random_tensor({g.out_c}, 5);
        Tensor y({g.batch, g.out_h, g.out_w, g.out_c});
        ops::conv2d_forward(plan, x, w, bias, y);
        INFO("batch " << t.batch << " " << t.h << "x" << t.w << "x" << t.c << " k" << t.k << " s" << t.stride << " same " << t.same);
        CHECK(max_abs_difference(y, reference_conv(x, w, bias, g)) < 1e-4f);
        ops::conv2d_forward(plan, x, w, Tensor(), y);
        CHECK(max_abs_difference(y, reference_conv(x, w, Tensor(), g)) < 1e-4f);
      }
    });
  }
  cpu::onednn::set_float32_forward_convolutions(default_forward);
}

TEST_CASE("conv2d backward matches the direct data and kernel gradients", "[ops][conv]") {
  struct Case {
    std::int64_t batch, h, w, c, f, stride;
    bool same;
  };
  test_util::for_each_gemm_path([&](GemmPath path) {
    for (const Case& t : {Case{2, 5, 6, 3, 4, 1, true}, Case{3, 7, 5, 8, 8, 1, true}, Case{2, 6, 6, 9, 8, 1, false},
                          Case{2, 7, 7, 8, 8, 2, true}, Case{40, 3, 3, 8, 16, 1, true}}) {
      INFO("GEMM path " << gemm_path_name(path));
      const Conv2dGeometry g = conv_geometry(t.batch, t.h, t.w, t.c, t.f, 3, t.stride, t.same);
      Conv2dPlan plan(g, Device::CPU);
      const Tensor x = random_tensor({g.batch, g.in_h, g.in_w, g.in_c}, 21);
      const Tensor w = random_tensor({3, 3, g.in_c, g.out_c}, 22);
      const Tensor dy = random_tensor({g.batch, g.out_h, g.out_w, g.out_c}, 23);
      Tensor dx(x.shape()), dw(w.shape()), db({g.out_c});
      ops::conv2d_backward(plan, x, w, dy, dx, dw, db);
      const auto [expected_dx, expected_dw] = reference_conv_gradients(x, w, dy, g);
      INFO("batch " << t.batch << " " << t.h << "x" << t.w << "x" << t.c << " -> " << t.f << " stride " << t.stride);
      CHECK(max_abs_difference(dx, expected_dx) < 1e-4f);
      CHECK(max_abs_difference(dw, expected_dw) < 1e-3f);
      // A first layer, which needs no input gradient (few channels: the direct kernel where there is one).
      Tensor first_layer_dw(w.shape()), first_layer_db({g.out_c});
      ops::conv2d_backward(plan, x, w, dy, Tensor(), first_layer_dw, first_layer_db);
      CHECK(max_abs_difference(first_layer_dw, expected_dw) < 1e-3f);
      CHECK(max_abs_difference(first_layer_db, db) < 1e-4f);
    }
  });
}

TEST_CASE("both Winograd tiles match direct convolution and its gradients, on every instruction set here", "[ops][conv]") {
  // Sizes the tiles divide and do not, channel counts with and without a remainder of the 8-channel blocks;
  // each instruction set's kernels forced in turn (AVX2's on an AVX-512 processor too).
  struct Case {
    std::int64_t batch, h, w, c, f;
    bool same;
  };
  const cpu::WinogradIsa best = cpu::winograd_isa();
  for (cpu::WinogradIsa isa : cpu::usable_winograd_isas())
    for (const Case& t : {Case{2, 9, 7, 8, 9, true}, Case{3, 8, 8, 16, 8, false}, Case{1, 1, 1, 8, 8, true},
                          Case{2, 13, 11, 11, 17, false}, Case{1, 4, 4, 9, 24, true}})
      for (int tile : {2, 4}) {
        cpu::set_winograd_isa(isa);
        const Conv2dGeometry g = conv_geometry(t.batch, t.h, t.w, t.c, t.f, 3, 1, t.same);
        INFO(cpu::winograd_isa_name(isa) << ", tile " << tile << ", batch " << t.batch << " " << t.h << "x" << t.w << "x"
                                         << t.c << " -> " << t.f);
        const Tensor x = random_tensor({g.batch, g.in_h, g.in_w, g.in_c}, 31);
        const Tensor w = random_tensor({3, 3, g.in_c, g.out_c}, 32);
        const Tensor bias = random_tensor({g.out_c}, 33);
        const Tensor dy = random_tensor({g.batch, g.out_h, g.out_w, g.out_c}, 34);
        Tensor y({g.batch, g.out_h, g.out_w, g.out_c}), dw(w.shape());
        const Tensor expected_y = reference_conv(x, w, bias, g);
        cpu::winograd_conv3x3(tile, x.data(), w.data(), bias.data(), false, y.data(), g);
        CHECK(max_abs_difference(y, expected_y) < 1e-4f);
        // ReLU applied by the output transform.
        Tensor expected_relu(y.shape());
        ops::activation_forward(Activation::Relu, expected_y, expected_relu);
        cpu::winograd_conv3x3(tile, x.data(), w.data(), bias.data(), true, y.data(), g);
        CHECK(max_abs_difference(y, expected_relu) < 1e-4f);
        cpu::winograd_conv3x3_kernel_gradient(tile, x.data(), dy.data(), dw.data(), g);
        Tensor dx(x.shape());
        cpu::winograd_conv3x3_data_gradient(dy.data(), w.data(), dx.data(), g);
        const auto [expected_dx, expected_dw] = reference_conv_gradients(x, w, dy, g);
        CHECK(max_abs_difference(dw, expected_dw) < 1e-3f);
        CHECK(max_abs_difference(dx, expected_dx) < 1e-4f);
      }
  cpu::set_winograd_isa(best);
  // The larger tile where it saves multiplications, the smaller where it would mostly compute padding.
  CHECK(cpu::winograd_tile(conv_geometry(128, 32, 32, 32, 32, 3, 1, true)) == 4);
  CHECK(cpu::winograd_tile(conv_geometry(128, 6, 6, 64, 128, 3, 1, true)) == 2);
  CHECK(cpu::winograd_tile(conv_geometry(128, 32, 32, 3, 32, 3, 1, true)) == 0);
  CHECK(cpu::winograd_tile(conv_geometry(128, 32, 32, 32, 32, 3, 2, true)) == 0);
  // One image does not repay the kernel transform of a small layer; a training batch does.
  CHECK_FALSE(cpu::winograd_repays_kernel_transform(conv_geometry(1, 6, 6, 64, 128, 3, 1, true), 2));
  CHECK(cpu::winograd_repays_kernel_transform(conv_geometry(128, 6, 6, 64, 128, 3, 1, true), 2));
}

TEST_CASE("the direct kernel for few input channels matches direct convolution and its kernel gradient, on every "
          "instruction set here",
          "[ops][conv]") {
  // One to seven channels, filter counts with and without a remainder of the 8- and 16-filter blocks, rows
  // with and without a remainder of the six-pixel blocks, same and valid padding, with and without ReLU.
  struct Case {
    std::int64_t batch, h, w, c, f;
    bool same;
  };
  const cpu::WinogradIsa best = cpu::winograd_isa();
  int ran = 0;
  for (cpu::WinogradIsa isa : cpu::usable_winograd_isas())
    for (const Case& t : {Case{2, 9, 7, 3, 32, true}, Case{1, 5, 13, 1, 20, false}, Case{3, 4, 4, 7, 8, true},
                          Case{1, 3, 3, 2, 5, false}, Case{2, 8, 6, 3, 37, true}}) {
      cpu::set_winograd_isa(isa);
      const Conv2dGeometry g = conv_geometry(t.batch, t.h, t.w, t.c, t.f, 3, 1, t.same);
      if (!cpu::direct_conv3x3_fits(g)) continue;  // the portable build has no direct kernel: im2col
      INFO(cpu::winograd_isa_name(isa) << ", batch " << t.batch << " " << t.h << "x" << t.w << "x" << t.c << " -> "
                                       << t.f << (t.same ? " same" : " valid"));
      const Tensor x = random_tensor({g.batch, g.in_h, g.in_w, g.in_c}, 41);
      const Tensor w = random_tensor({3, 3, g.in_c, g.out_c}, 42);
      const Tensor bias = random_tensor({g.out_c}, 43);
      Tensor y({g.batch, g.out_h, g.out_w, g.out_c}), expected_relu(y.shape());
      cpu::direct_conv3x3(x.data(), w.data(), nullptr, false, y.data(), g);
      CHECK(max_abs_difference(y, reference_conv(x, w, Tensor(), g)) < 1e-5f);
      ops::activation_forward(Activation::Relu, reference_conv(x, w, bias, g), expected_relu);
      cpu::direct_conv3x3(x.data(), w.data(), bias.data(), true, y.data(), g);
      CHECK(max_abs_difference(y, expected_relu) < 1e-5f);
      const Tensor dy = random_tensor(y.shape(), 44);
      Tensor dw(w.shape());
      cpu::direct_conv3x3_kernel_gradient(x.data(), dy.data(), dw.data(), g);
      CHECK(max_abs_difference(dw, reference_conv_gradients(x, w, dy, g).second) < 1e-4f);
      ++ran;
    }
  cpu::set_winograd_isa(best);
  // The first layer of the flagship takes it wherever the processor has AVX2; eight channels do not.
  if (best != cpu::WinogradIsa::Portable) {
    CHECK(ran > 0);
    CHECK(cpu::direct_conv3x3_fits(conv_geometry(128, 32, 32, 3, 32, 3, 1, true)));
  }
  CHECK_FALSE(cpu::direct_conv3x3_fits(conv_geometry(128, 32, 32, 8, 32, 3, 1, true)));
  CHECK_FALSE(cpu::direct_conv3x3_fits(conv_geometry(128, 32, 32, 3, 32, 3, 2, true)));
}

TEST_CASE("conv2d results do not depend on the thread count", "[ops][conv]") {
  const Conv2dGeometry g = conv_geometry(33, 10, 10, 8, 16, 3, 1, true);
  Conv2dPlan plan(g, Device::CPU);
  const Tensor x = random_tensor({g.batch, g.in_h, g.in_w, g.in_c}, 6);
  const Tensor w = random_tensor({3, 3, 8, 16}, 7);
  const Tensor dy = random_tensor({g.batch, g.out_h, g.out_w, g.out_c}, 8);
  auto run = [&](int threads) {
    set_num_threads(threads);
    Tensor y({g.batch, g.out_h, g.out_w, g.out_c}), dx(x.shape()), dw(w.shape()), db({16});
    ops::conv2d_forward(plan, x, w, Tensor(), y);
    ops::conv2d_backward(plan, x, w, dy, dx, dw, db);
    return std::make_tuple(y, dx, dw);
  };
  const auto [y1, dx1, dw1] = run(1);
  const auto [y2, dx2, dw2] = run(2);
  set_num_threads(0);
  CHECK(max_abs_difference(y1, y2) < 1e-5f);
  CHECK(max_abs_difference(dx1, dx2) < 1e-5f);
  CHECK(max_abs_difference(dw1, dw2) < 1e-3f);
}

TEST_CASE("pooling matches the reference, including clipped windows", "[ops]") {
  const Pool2dGeometry g{2, 5, 5, 3, 3, 3, 2, 2, 2, 2, 0, 0};  // same padding: 5 -> 3, last window clipped
  const Tensor x = random_tensor({2, 5, 5, 3}, 9);
  Tensor max_y({2, 3, 3, 3}), avg_y({2, 3, 3, 3});
  Pool2dPlan max_plan(g, Device::CPU);
  Pool2dGeometry average = g;
  average.mode = PoolMode::Average;
  Pool2dPlan avg_plan(average, Device::CPU);
  ops::pool2d_forward(max_plan, x, max_y);
  ops::pool2d_forward(avg_plan, x, avg_y);
  for (std::int64_t n = 0; n < 2; ++n)
    for (std::int64_t oh = 0; oh < 3; ++oh)
      for (std::int64_t ow = 0; ow < 3; ++ow)
        for (std::int64_t c = 0; c < 3; ++c) {
          float peak = -1e30f;
          double total = 0;
          int cells = 0;
          for (std::int64_t ih = oh * 2; ih < std::min<std::int64_t>(oh * 2 + 2, 5); ++ih)
            for (std::int64_t iw = ow * 2; iw < std::min<std::int64_t>(ow * 2 + 2, 5); ++iw) {
              const float v = x.data()[((n * 5 + ih) * 5 + iw) * 3 + c];
              peak = std::max(peak, v);
              total += v;
              ++cells;
            }
          const std::int64_t at = ((n * 3 + oh) * 3 + ow) * 3 + c;
          CHECK(max_y.data()[at] == peak);
          CHECK(avg_y.data()[at] == Approx(total / cells).margin(1e-6));
        }
}

TEST_CASE("max pooling's gradient goes to the first maximum and nowhere past the windows", "[ops]") {
  // Valid 2x2 pooling of 5x5: the windows tile 4x4; the last row and column get no gradient, whatever the
  // gradient buffer held before (here NaN). Ties (the zeros of a ReLU) send it to the first in the window.
  // 32 channels take the AVX-512 kernels where the processor has them (forced off and on in turn), 3 the
  // portable loops; float32 and bfloat16 alike.
  const cpu::WinogradIsa best = cpu::winograd_isa();
  for (cpu::WinogradIsa isa : cpu::usable_winograd_isas())
    for (const std::int64_t c : {3, 32})
      for (const DType type : {DType::Float32, DType::BFloat16})
        for (bool ties : {false, true}) {
          cpu::set_winograd_isa(isa);
          const Pool2dGeometry g{2, 5, 5, c, 2, 2, 2, 2, 2, 2, 0, 0};
          const Tensor x = (ties ? Tensor::full({2, 5, 5, c}, 0.0f) : random_tensor({2, 5, 5, c}, 10)).to(type);
          const Tensor dy = random_tensor({2, 2, 2, c}, 11).to(type);
          Tensor y({2, 2, 2, c}, type);
          Tensor dx = Tensor::full({2, 5, 5, c}, std::nanf("")).to(type);
          Pool2dPlan plan(g, Device::CPU);
          ops::pool2d_forward(plan, x, y);
          ops::pool2d_backward(plan, x, y, dy, dx);
          const std::vector<float> xs = x.to_vector(), ys = y.to_vector(), dys = dy.to_vector();
          std::vector<float> expected(xs.size(), 0.0f);
          for (std::int64_t n = 0; n < 2; ++n)
            for (std::int64_t oh = 0; oh < 2; ++oh)
              for (std::int64_t ow = 0; ow < 2; ++ow)
                for (std::int64_t k = 0; k < c; ++k) {
                  const std::int64_t out = ((n * 2 + oh) * 2 + ow) * c + k;
                  std::int64_t first = -1;
                  float peak = -1e30f;
                  for (std::int64_t ih = oh * 2; ih < oh * 2 + 2; ++ih)
                    for (std::int64_t iw = ow * 2; iw < ow * 2 + 2; ++iw) {
                      const std::int64_t at = ((n * 5 + ih) * 5 + iw) * c + k;
                      peak = std::max(peak, xs[at]);
                      if (first < 0 && xs[at] == ys[out]) first = at;
                    }
                  REQUIRE(ys[out] == peak);
                  expected[first] = dys[out];
                }
          INFO(cpu::winograd_isa_name(isa) << ", " << c << " channels, " << dtype_name(type) << ", ties " << ties);
          CHECK(dx.to_vector() == expected);
        }
  cpu::set_winograd_isa(best);
}

TEST_CASE("softmax cross-entropy is stable for huge logits and matches the direct formula", "[ops][loss]") {
  Tensor logits = Tensor::from_values({2, 3}, std::vector<float>{1000, 0, -1000, 0.5f, 1.5f, -0.5f});
  const Tensor sparse = Tensor::from_values({2}, std::vector<float>{0, 1});
  const Tensor onehot = Tensor::from_values({2, 3}, std::vector<float>{1, 0, 0, 0, 1, 0});
  Tensor grad({2, 3});
  const double loss = ops::softmax_cross_entropy(logits, sparse, grad);
  const double row2 = -std::log(std::exp(1.5) / (std::exp(0.5) + std::exp(1.5) + std::exp(-0.5)));
  CHECK(std::isfinite(loss));
  CHECK(loss == Approx((0.0 + row2) / 2).epsilon(1e-6));
  CHECK(ops::softmax_cross_entropy(logits, onehot, Tensor()) == Approx(loss));
  CHECK(grad.data()[0] == Approx(0.0).margin(1e-7));  // softmax 1 minus target 1
  CHECK(ops::count_correct(logits, sparse) == 2);
  CHECK_THROWS_AS(ops::softmax_cross_entropy(logits, Tensor::from_values({2}, std::vector<float>{0, 3}), grad), InvalidArgument);
  CHECK_THROWS_AS(ops::softmax_cross_entropy(logits, Tensor({3}), grad), InvalidArgument);
}

TEST_CASE("dropout masks keep about 1 - rate, scale survivors and depend only on the seed", "[ops]") {
  Tensor a({100000}), b({100000});
  set_num_threads(1);
  ops::dropout_mask(a, 0.3f, 42);
  set_num_threads(2);
  ops::dropout_mask(b, 0.3f, 42);
  set_num_threads(0);
  CHECK(max_abs_difference(a, b) == 0.0f);
  std::int64_t kept = 0;
  for (float v : a.values()) {
    CHECK((v == 0.0f || v == Approx(1.0f / 0.7f)));
    kept += v != 0.0f;
  }
  CHECK(kept == Approx(70000).margin(700));
  ops::dropout_mask(b, 0.3f, 43);
  CHECK(max_abs_difference(a, b) > 0.0f);
  CHECK_THROWS_AS(ops::dropout_mask(a, 1.0f, 1), InvalidArgument);
}

TEST_CASE("ops refuse operands of mismatched shapes", "[ops]") {
  CHECK_THROWS_AS(ops::axpy(1.0f, Tensor({3}), Tensor({4})), InvalidArgument);
  CHECK_THROWS_AS(ops::add_bias(Tensor({2, 3}), Tensor({2})), InvalidArgument);
  Conv2dPlan plan(conv_geometry(1, 4, 4, 2, 3, 3, 1, true), Device::CPU);
  Tensor y({1, 4, 4, 3});
  CHECK_THROWS_AS(ops::conv2d_forward(plan, Tensor({1, 4, 4, 3}), Tensor({3, 3, 2, 3}), Tensor(), y), InvalidArgument);
}
