// The fused passes against the Backend's defaults, which run the unfused ops one after the other (what a
// backend without its own fused kernels, such as CUDA's, computes).
#include <catch2/catch.hpp>
#include <algorithm>
#include <random>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/tensor/ops.hpp"
#include "tensor/backend.hpp"
#include "tensor/cpu/winograd.hpp"
#include "test_util.hpp"

using namespace cohort;
using test_util::first_beyond;
using test_util::max_abs_difference;
using test_util::random_tensor;

namespace {

constexpr Activation kElementwise[] = {Activation::Linear, Activation::Relu, Activation::Sigmoid, Activation::Tanh};

}  // namespace

TEST_CASE("fused batch normalization and activation equal the ops one after the other", "[ops][fused]") {
  Backend& cpu = backend_for(Device::CPU);
  const BatchNormGeometry g{.channels = 13, .epsilon = 1e-3f};
  const Tensor x = random_tensor({4, 5, 3, 13}, 1, -2.0f, 2.0f);
  const Tensor gamma = random_tensor({13}, 2, 0.5f, 1.5f);
  const Tensor beta = random_tensor({13}, 3);
  const Tensor dy = random_tensor(x.shape(), 4);
  for (Activation activation : kElementwise) {
    INFO(activation_name(activation));
    Tensor y(x.shape()), mean({13}), variance({13}), expected_y(x.shape()), expected_mean({13}), expected_variance({13});
    cpu.batch_norm_activation_forward_training(nullptr, g, x, gamma, beta, activation, y, mean, variance);
    cpu.Backend::batch_norm_activation_forward_training(nullptr, g, x, gamma, beta, activation, expected_y,
                                                        expected_mean, expected_variance);
    CHECK(max_abs_difference(y, expected_y) < 1e-6f);
    CHECK(max_abs_difference(mean, expected_mean) == 0.0f);
    CHECK(max_abs_difference(variance, expected_variance) == 0.0f);
    if (activation == Activation::Relu) CHECK(*std::min_element(y.values().begin(), y.values().end()) == 0.0f);

    Tensor dx(x.shape()), dgamma({13}), dbeta({13}), expected_dx(x.shape()), expected_dgamma({13}), expected_dbeta({13});
    cpu.batch_norm_activation_backward(nullptr, g, x, y, gamma, beta, dy, mean, variance, activation, dx, dgamma, dbeta);
    cpu.Backend::batch_norm_activation_backward(nullptr, g, x, expected_y, gamma, beta, dy, mean, variance, activation,
                                                expected_dx, expected_dgamma, expected_dbeta);
    CHECK(max_abs_difference(dx, expected_dx) < 1e-5f);
    CHECK(max_abs_difference(dgamma, expected_dgamma) < 1e-4f);
    CHECK(max_abs_difference(dbeta, expected_dbeta) < 1e-4f);
    // Without the data gradient (a first layer) the parameter gradients are the same.
    Tensor dgamma_only({13}), dbeta_only({13});
    cpu.batch_norm_activation_backward(nullptr, g, x, y, gamma, beta, dy, mean, variance, activation, Tensor(),
                                       dgamma_only, dbeta_only);
    CHECK(max_abs_difference(dgamma_only, dgamma) == 0.0f);

    Tensor inferred(x.shape()), expected_inferred(x.shape());
    cpu.batch_norm_activation_forward_inference(nullptr, g, x, gamma, beta, mean, variance, activation, inferred);
    cpu.Backend::batch_norm_activation_forward_inference(nullptr, g, x, gamma, beta, mean, variance, activation,
                                                         expected_inferred);
    CHECK(max_abs_difference(inferred, expected_inferred) < 1e-6f);
  }
}

TEST_CASE("fused batch normalization and activation equal the ops one after the other in bfloat16", "[ops][fused][dtype]") {
  Backend& cpu = backend_for(Device::CPU);
  if (!cpu.computes(Backend::Kernel16::BatchNorm, DType::BFloat16)) {
    WARN("this processor computes bfloat16 in float32 stand-ins: the CPU has no 16-bit pass to compare here");
    return;
  }
  const BatchNormGeometry g{.channels = 13, .epsilon = 1e-3f};
  const Tensor x = random_tensor({4, 5, 3, 13}, 1, -2.0f, 2.0f).to(DType::BFloat16);
  const Tensor gamma = random_tensor({13}, 2, 0.5f, 1.5f);
  const Tensor beta = random_tensor({13}, 3);
  const Tensor dy = random_tensor(x.shape(), 4).to(DType::BFloat16);
  const auto low = [&] { return Tensor::uninitialized(x.shape(), DType::BFloat16); };
  const auto wide = [](const Tensor& t) { return t.to(DType::Float32); };
  for (Activation activation : kElementwise) {
    INFO(activation_name(activation));
    Tensor y = low(), mean({13}), variance({13});
    cpu.batch_norm_activation_forward_training(nullptr, g, x, gamma, beta, activation, y, mean, variance);
    // The defaults round the activation's gradient to bfloat16 before the normalization's: a few units in
    // the last place of bfloat16 (2^-8 relative) apart.
    Tensor dx = low(), dgamma({13}), dbeta({13}), expected_dx = low(), expected_dgamma({13}), expected_dbeta({13});
    cpu.batch_norm_activation_backward(nullptr, g, x, y, gamma, beta, dy, mean, variance, activation, dx, dgamma, dbeta);
    cpu.Backend::batch_norm_activation_backward(nullptr, g, x, y, gamma, beta, dy, mean, variance, activation,
                                                expected_dx, expected_dgamma, expected_dbeta);
    CHECK(max_abs_difference(wide(dx), wide(expected_dx)) < 0.05f);
    CHECK(max_abs_difference(dgamma, expected_dgamma) < 0.1f);
    CHECK(max_abs_difference(dbeta, expected_dbeta) < 0.1f);
  }
}

TEST_CASE("bias and activation fused equal the ops one after the other, forward and backward", "[ops][fused]") {
  Backend& cpu = backend_for(Device::CPU);
  const Tensor pre = random_tensor({7, 19}, 5, -2.0f, 2.0f);
  const Tensor bias = random_tensor({19}, 6);
  const Tensor dy = random_tensor({7, 19}, 7);
  for (Activation activation : kElementwise) {
    INFO(activation_name(activation));
    const Tensor y = pre.clone(), expected_y = pre.clone();
    cpu.bias_activation_forward(y, bias, activation);
    cpu.Backend::bias_activation_forward(expected_y, bias, activation);
    CHECK(max_abs_difference(y, expected_y) < 1e-6f);
    Tensor dpre(y.shape()), dbias({19}), expected_dpre(y.shape()), expected_dbias({19});
    cpu.activation_bias_backward(activation, y, dy, dpre, dbias);
    cpu.Backend::activation_bias_backward(activation, y, dy, expected_dpre, expected_dbias);
    CHECK(max_abs_difference(dpre, expected_dpre) == 0.0f);
    CHECK(max_abs_difference(dbias, expected_dbias) == 0.0f);
  }
  CHECK_THROWS_AS(ops::bias_activation_forward(pre.clone(), bias, Activation::Softmax), InvalidArgument);
}

TEST_CASE("convolution with its activation fused equals the ops one after the other", "[ops][fused][conv]") {
  Backend& cpu = backend_for(Device::CPU);
  // A Winograd geometry, an im2col one (stride 2) and a small batch that goes through im2col too.
  for (const Conv2dGeometry& g : {Conv2dGeometry{8, 12, 12, 8, 12, 12, 16, 3, 3, 1, 1, 1, 1},
                                  Conv2dGeometry{3, 9, 9, 5, 4, 4, 7, 3, 3, 2, 2, 0, 0},
                                  Conv2dGeometry{1, 6, 6, 4, 6, 6, 8, 3, 3, 1, 1, 1, 1}}) {
    const auto plan = cpu.plan(g);
    const Tensor x = random_tensor({g.batch, g.in_h, g.in_w, g.in_c}, 8);
    const Tensor kernel = random_tensor({3, 3, g.in_c, g.out_c}, 9);
    const Tensor bias = random_tensor({g.out_c}, 10);
    for (Activation activation : kElementwise) {
      INFO(activation_name(activation) << ", stride " << g.stride_h << ", batch " << g.batch);
      Tensor y({g.batch, g.out_h, g.out_w, g.out_c}), expected_y(y.shape());
      cpu.conv2d_forward_activated(plan.get(), g, x, kernel, bias, activation, y);
      cpu.Backend::conv2d_forward_activated(plan.get(), g, x, kernel, bias, activation, expected_y);
      CHECK(max_abs_difference(y, expected_y) < 1e-6f);
    }
  }
}

TEST_CASE("batch normalization refuses an input of another channel count than its plan's", "[ops][batchnorm]") {
  BatchNormPlan plan({.channels = 5, .epsilon = 1e-3f}, Device::CPU);
  const Tensor x = random_tensor({2, 3}, 1);
  Tensor y(x.shape()), mean({3}), variance({3});
  CHECK_THROWS_AS(ops::batch_norm_forward_training(plan, x, Tensor::full({3}, 1.0f), Tensor({3}), y, mean, variance),
                  InvalidArgument);
}

TEST_CASE("batch normalization's AVX-512 passes equal its portable loops, in float32 and bfloat16", "[ops][batchnorm]") {
  const std::vector<cpu::WinogradIsa> isas = cpu::usable_winograd_isas();
  if (isas.back() != cpu::WinogradIsa::Avx512) {
    WARN("this processor has no AVX-512: only the portable loops run here");
    return;
  }
  const cpu::WinogradIsa best = cpu::winograd_isa();
  struct Results {
    std::vector<float> y, mean, variance, dx, dgamma, dbeta, unfused_dx, inferred;
  };
  // 16 channels (one chunk of 16 lanes), 48 (three), 144 (eight summed at once, then one); 231 rows, which the
  // 64-row blocks do not divide.
  for (const std::int64_t channels : {16, 48, 144})
    for (const DType type : {DType::Float32, DType::BFloat16})
      for (const Activation activation : {Activation::Linear, Activation::Relu}) {
        INFO(channels << " channels, " << dtype_name(type) << ", " << activation_name(activation));
        const Shape shape{3, 7, 11, channels}, c{channels};
        const auto run = [&](cpu::WinogradIsa isa) {
          cpu::set_winograd_isa(isa);
          BatchNormPlan plan({.channels = channels, .epsilon = 1e-3f}, Device::CPU);
          const Tensor x = random_tensor(shape, 51, -2.0f, 3.0f).to(type), dy = random_tensor(shape, 52).to(type);
          const Tensor gamma = random_tensor(c, 53, 0.5f, 1.5f), beta = random_tensor(c, 54);
          Tensor y(shape, type), dx(shape, type), unfused_dx(shape, type), inferred(shape, type);
          Tensor mean(c), variance(c), dgamma(c), dbeta(c), unfused_dgamma(c), unfused_dbeta(c);
          ops::batch_norm_activation_forward_training(plan, x, gamma, beta, activation, y, mean, variance);
          ops::batch_norm_activation_backward(plan, x, y, gamma, beta, dy, mean, variance, activation, dx, dgamma, dbeta);
          ops::batch_norm_backward(plan, x, gamma, dy, mean, variance, unfused_dx, unfused_dgamma, unfused_dbeta);
          ops::batch_norm_activation_forward_inference(plan, x, gamma, beta, mean, variance, activation, inferred);
          return Results{y.to_vector(),      mean.to_vector(),  variance.to_vector(),   dx.to_vector(),
                         dgamma.to_vector(), dbeta.to_vector(), unfused_dx.to_vector(), inferred.to_vector()};
        };
        const Results fast = run(cpu::WinogradIsa::Avx512), portable = run(isas[isas.size() - 2]);
        // Sums in another order: float32 results agree to a few of its units, bfloat16 ones round at most a
        // unit of their own apart.
        const double rounding = type == DType::BFloat16 ? 2 * unit_roundoff(DType::BFloat16) : 1e-5;
        CHECK_FALSE(first_beyond(portable.y, fast.y, rounding));
        CHECK_FALSE(first_beyond(portable.inferred, fast.inferred, rounding));
        CHECK_FALSE(first_beyond(portable.dx, fast.dx, rounding));
        CHECK_FALSE(first_beyond(portable.unfused_dx, fast.unfused_dx, rounding));
        CHECK_FALSE(first_beyond(portable.mean, fast.mean, 1e-5));
        CHECK_FALSE(first_beyond(portable.variance, fast.variance, 1e-5));
        CHECK_FALSE(first_beyond(portable.dgamma, fast.dgamma, 1e-5));
        CHECK_FALSE(first_beyond(portable.dbeta, fast.dbeta, 1e-5));
      }
  cpu::set_winograd_isa(best);
}

TEST_CASE("batch statistics stay precise for a large mean over a large batch", "[ops][batchnorm]") {
  // Activations of mean 1000 and spread 1 over 100,000 rows: float sums of x and x^2 would lose the variance.
  // 16 channels take the AVX-512 passes where the processor has them, 3 the portable loops.
  for (const std::int64_t channels : {3, 16}) {
    const std::int64_t rows = 100000;
    Tensor x({rows, channels});
    std::mt19937_64 rng(21);
    std::normal_distribution<double> normal(0.0, 1.0);
    std::vector<double> sum(channels, 0.0), sum_of_squares(channels, 0.0);
    for (std::int64_t m = 0; m < rows; ++m)
      for (std::int64_t c = 0; c < channels; ++c) {
        const float v = static_cast<float>(1000.0 + (c + 1) * normal(rng));
        x.data()[m * channels + c] = v;
        sum[c] += v;
        sum_of_squares[c] += static_cast<double>(v) * v;
      }
    BatchNormPlan plan({.channels = channels, .epsilon = 1e-3f}, Device::CPU);
    Tensor y(x.shape()), mean({channels}), variance({channels});
    ops::batch_norm_forward_training(plan, x, Tensor::full({channels}, 1.0f), Tensor({channels}), y, mean, variance);
    for (std::int64_t c = 0; c < channels; ++c) {
      const double expected_mean = sum[c] / rows;
      const double expected_variance = sum_of_squares[c] / rows - expected_mean * expected_mean;
      CHECK(mean.data()[c] == Approx(expected_mean).epsilon(1e-7));
      CHECK(variance.data()[c] == Approx(expected_variance).epsilon(1e-4));
    }
  }
}
