// Every op with bfloat16 and float16 operands against the same op in float32 on the same values, its 16-bit
// outputs rounded once: within a tolerance derived from the type's unit roundoff, and a check that the
// comparison fails one step beyond it. Operands a layer keeps in float32 under a mixed policy (biases added
// in a Dense layer, batch normalization's scale and statistics, weight gradients) stay float32 here too.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <utility>

#include "cohort/core/config.hpp"
#include "cohort/tensor/ops.hpp"
#include "tensor/cpu/onednn.hpp"
#include "test_util.hpp"

using namespace cohort;

namespace {

using test_util::low_in, test_util::low_out, test_util::wide_in, test_util::wide_out, test_util::Operand16;

double tolerance(DType type) { return 8 * unit_roundoff(type); }

// Where an output is beyond the type's tolerance of float32's (test_util::first_beyond); empty when nowhere.
std::string difference(const std::vector<float>& expected, const std::vector<float>& actual, double tolerance) {
  const auto beyond = test_util::first_beyond(expected, actual, tolerance);
  if (!beyond) return {};
  return fmt::format("element {}: {} vs float32's {} (allowed {:.3g})", beyond->index, actual[beyond->index],
                     expected[beyond->index], beyond->allowed);
}

using Run = std::function<double(const std::vector<Tensor>&)>;

// Runs `op` on operands of `type` and on float32 operands holding the same values; compares every output
// (the float32 one rounded to the output's type) and the returned value.
void check_op(const std::string& name, DType type, const std::vector<Operand16>& operands, const Run& op) {
  INFO(name << " in " << dtype_name(type));
  std::vector<Tensor> low, wide;
  for (std::size_t i = 0; i < operands.size(); ++i) {
    const Operand16& o = operands[i];
    const Tensor values = test_util::random_tensor(o.shape, 100 + i, o.min, o.max);
    low.push_back(o.low ? values.to(type) : values.clone());
    wide.push_back(low.back().to(DType::Float32).clone());
  }
  const double low_result = op(low), wide_result = op(wide);
  CHECK(std::abs(low_result - wide_result) <= tolerance(type) * (std::abs(wide_result) + 1e-12));
  for (std::size_t i = 0; i < operands.size(); ++i) {
    if (!operands[i].output) continue;
    INFO("output " << i);
    REQUIRE(low[i].dtype() == (operands[i].low ? type : DType::Float32));
    const Tensor expected = wide[i].to(low[i].dtype());
    const std::string found = difference(expected.to_vector(), low[i].to_vector(), tolerance(type));
    if (!found.empty()) FAIL(found);
  }
}

Conv2dGeometry conv(std::int64_t batch, std::int64_t size, std::int64_t in_c, std::int64_t out_c, std::int64_t kernel,
                    std::int64_t stride, std::int64_t pad) {
  const std::int64_t out_size = (size + 2 * pad - kernel) / stride + 1;
  return {.batch = batch, .in_h = size, .in_w = size, .in_c = in_c, .out_h = out_size, .out_w = out_size, .out_c = out_c,
          .kernel_h = kernel, .kernel_w = kernel, .stride_h = stride, .stride_w = stride, .pad_top = pad, .pad_left = pad};
}

}  // namespace

TEST_CASE("bfloat16 convolutions and products run on oneDNN where the processor has bfloat16 instructions",
          "[tensor][dtype]") {
  using cpu::onednn::Bf16Kernels;
  const char* chosen = std::getenv("COHORT_BF16_KERNELS");
  const char* isa = std::getenv("ONEDNN_MAX_CPU_ISA");
  const bool bf16_processor = __builtin_cpu_supports("avx512bf16");  // every AMX processor has it too
  INFO(cpu::onednn::bf16_kernels_description());
  if (COHORT_HAS_ONEDNN && bf16_processor && chosen == nullptr && (isa == nullptr || std::string(isa).find("BF16") != std::string::npos))
    CHECK(cpu::onednn::bf16_kernels() == Bf16Kernels::Native);
  else if (!COHORT_HAS_ONEDNN || !bf16_processor)
    CHECK_THROWS_WITH(cpu::onednn::set_bf16_kernels(Bf16Kernels::Native), Catch::Contains("cannot run"));
}

TEST_CASE("the comparison of 16-bit results fails one step beyond the type's tolerance", "[tensor][dtype]") {
  for (DType type : {DType::BFloat16, DType::Float16}) {
    const std::vector<float> expected{1.0f, -2.0f, 0.5f, 4.0f};
    double squares = 0;
    for (float v : expected) squares += v * v;
    const double allowed = tolerance(type) * (2.0 + std::sqrt(squares / 4));
    std::vector<float> actual = expected;
    actual[1] = static_cast<float>(-2.0 - 0.99 * allowed);
    CHECK(difference(expected, actual, tolerance(type)).empty());
    actual[1] = static_cast<float>(-2.0 - 1.01 * allowed);
    CHECK(difference(expected, actual, tolerance(type)).find("element 1") == 0);
  }
}

TEST_CASE("elementwise ops, reductions and matrix products in 16-bit types match float32", "[tensor][dtype]") {
  for (DType type : {DType::BFloat16, DType::Float16}) {
    const Shape shape{37, 29};
    check_op("fill", type, {low_out(shape)}, [](const std::vector<Tensor>& t) { ops::fill(t[0], 0.3f); return 0.0; });
    check_op("axpy", type, {low_in(shape), low_out(shape)}, [](const std::vector<Tensor>& t) { ops::axpy(0.75f, t[0], t[1]); return 0.0; });
    check_op("scale", type, {low_out(shape)}, [](const std::vector<Tensor>& t) { ops::scale(t[0], -1.5f); return 0.0; });
    check_op("multiply", type, {low_in(shape), low_in(shape), low_out(shape)}, [](const std::vector<Tensor>& t) {
      ops::multiply(t[0], t[1], t[2]);
      return 0.0;
    });
    check_op("sum", type, {low_in(shape)}, [](const std::vector<Tensor>& t) { return ops::sum(t[0]); });
    check_op("sum_of_squares", type, {low_in(shape)}, [](const std::vector<Tensor>& t) { return ops::sum_of_squares(t[0]); });
    for (bool transpose_a : {false, true})
      for (bool transpose_b : {false, true}) {
        const Shape a = transpose_a ? Shape{40, 33} : Shape{33, 40}, b = transpose_b ? Shape{17, 40} : Shape{40, 17};
        check_op("matmul", type, {low_in(a), low_in(b), low_out({33, 17})}, [&](const std::vector<Tensor>& t) {
          ops::matmul(t[0], transpose_a, t[1], transpose_b, t[2], 1.0f, 0.5f);
          return 0.0;
        });
        // A weight gradient: 16-bit factors, a float32 product.
        check_op("matmul into float32", type, {low_in(a), low_in(b), wide_out({33, 17})}, [&](const std::vector<Tensor>& t) {
          ops::matmul(t[0], transpose_a, t[1], transpose_b, t[2]);
          return 0.0;
        });
      }
    check_op("add_bias", type, {low_out(shape), wide_in({29})}, [](const std::vector<Tensor>& t) { ops::add_bias(t[0], t[1]); return 0.0; });
    check_op("bias_gradient", type, {low_in(shape), wide_out({29})}, [](const std::vector<Tensor>& t) {
      ops::bias_gradient(t[0], t[1]);
      return 0.0;
    });
    for (Activation activation : {Activation::Relu, Activation::Sigmoid, Activation::Tanh, Activation::Softmax}) {
      check_op("activation_forward", type, {low_in(shape, -3, 3), low_out(shape)}, [&](const std::vector<Tensor>& t) {
        ops::activation_forward(activation, t[0], t[1]);
        return 0.0;
      });
      check_op("activation_backward", type, {low_in(shape, 0.01f, 0.99f), low_in(shape), low_out(shape)}, [&](const std::vector<Tensor>& t) {
        ops::activation_backward(activation, t[0], t[1], t[2]);
        return 0.0;
      });
    }
  }
}

TEST_CASE("convolution, pooling and batch normalization in 16-bit types match float32", "[tensor][dtype]") {
  for (DType type : {DType::BFloat16, DType::Float16}) {
    // The last has a small output of a deep kernel, whose bfloat16 kernel gradient is a sum of matrix products
    // over four chunks of samples, the last one shorter (run from two threads at once, they had raced).
    for (const Conv2dGeometry& g : {conv(3, 9, 5, 7, 3, 1, 1), conv(2, 11, 4, 6, 3, 2, 0), conv(2, 8, 16, 8, 1, 1, 0),
                                    conv(10, 8, 256, 24, 3, 1, 1)}) {
      const Shape x{g.batch, g.in_h, g.in_w, g.in_c}, k{g.kernel_h, g.kernel_w, g.in_c, g.out_c}, y{g.batch, g.out_h, g.out_w, g.out_c};
      Conv2dPlan plan(g, Device::CPU);
      check_op("conv2d_forward", type, {low_in(x), low_in(k), low_in({g.out_c}), low_out(y)}, [&](const std::vector<Tensor>& t) {
        ops::conv2d_activation_forward(plan, t[0], t[1], t[2], Activation::Relu, t[3]);
        return 0.0;
      });
      check_op("conv2d_backward", type, {low_in(x), low_in(k), low_in(y), low_out(x), wide_out(k), wide_out({g.out_c})},
               [&](const std::vector<Tensor>& t) {
                 ops::conv2d_backward(plan, t[0], t[1], t[2], t[3], t[4], t[5]);
                 return 0.0;
               });
      check_op("conv2d_backward without a bias", type, {low_in(x), low_in(k), low_in(y), low_out(x), wide_out(k)},
               [&](const std::vector<Tensor>& t) {
                 ops::conv2d_backward(plan, t[0], t[1], t[2], t[3], t[4], Tensor());
                 return 0.0;
               });
    }
    // 3x3 windows at stride 2 overlap; 2x2 ones tile the input but its last row and column.
    for (const auto [mode, pool] : {std::pair{PoolMode::Max, 3}, std::pair{PoolMode::Average, 3}, std::pair{PoolMode::Max, 2}}) {
      const Pool2dGeometry g{.batch = 2, .in_h = 9, .in_w = 9, .channels = 5, .out_h = 4, .out_w = 4, .pool_h = pool,
                             .pool_w = pool, .stride_h = 2, .stride_w = 2, .mode = mode};
      Pool2dPlan plan(g, Device::CPU);
      const Shape x{2, 9, 9, 5}, y{2, 4, 4, 5};
      check_op("pool2d_forward", type, {low_in(x), low_out(y)}, [&](const std::vector<Tensor>& t) {
        ops::pool2d_forward(plan, t[0], t[1]);
        return 0.0;
      });
      // The backward pass takes the forward's own output, so that the maxima are found again.
      check_op("pool2d_backward", type, {low_in(x), low_out(y), low_in(y), low_out(x)}, [&](const std::vector<Tensor>& t) {
        ops::pool2d_forward(plan, t[0], t[1]);
        ops::pool2d_backward(plan, t[0], t[1], t[2], t[3]);
        return 0.0;
      });
    }
    // 48 channels take the AVX-512 passes where the processor has them, 6 the portable loops.
    for (const std::int64_t channels : {6, 48}) {
      BatchNormPlan plan(BatchNormGeometry{.channels = channels}, Device::CPU);
      const Shape x{4, 5, 5, channels}, c{channels};
      check_op("batch_norm_forward_training", type,
               {low_in(x, -2, 3), wide_in(c, 0.5f, 2), wide_in(c), low_out(x), wide_out(c), wide_out(c)},
               [&](const std::vector<Tensor>& t) {
                 ops::batch_norm_activation_forward_training(plan, t[0], t[1], t[2], Activation::Relu, t[3], t[4], t[5]);
                 return 0.0;
               });
      check_op("batch_norm_forward_inference", type,
               {low_in(x), wide_in(c, 0.5f, 2), wide_in(c), wide_in(c), wide_in(c, 0.5f, 2), low_out(x)},
               [&](const std::vector<Tensor>& t) {
                 ops::batch_norm_forward_inference(plan, t[0], t[1], t[2], t[3], t[4], t[5]);
                 return 0.0;
               });
      check_op("batch_norm_backward", type,
               {low_in(x, -2, 3), wide_in(c, 0.5f, 2), low_in(x), wide_out(c), wide_out(c), low_out(x), wide_out(c),
                wide_out(c)},
               [&](const std::vector<Tensor>& t) {
                 const Tensor y = Tensor(x, t[0].dtype());
                 ops::batch_norm_forward_training(plan, t[0], t[1], Tensor(c), y, t[3], t[4]);
                 ops::batch_norm_backward(plan, t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]);
                 return 0.0;
               });
    }
  }
}

TEST_CASE("dropout masks, losses and accuracy in 16-bit types match float32", "[tensor][dtype]") {
  for (DType type : {DType::BFloat16, DType::Float16}) {
    check_op("dropout_mask", type, {low_out({1000})}, [](const std::vector<Tensor>& t) {
      ops::dropout_mask(t[0], 0.3f, 11);
      return 0.0;
    });
    const Tensor labels = Tensor::from_values({6}, std::vector<std::int32_t>{0, 3, 2, 4, 1, 3});
    check_op("softmax_cross_entropy", type, {low_in({6, 5}, -4, 4), low_out({6, 5})}, [&](const std::vector<Tensor>& t) {
      return ops::softmax_cross_entropy(t[0], labels, t[1]);
    });
    check_op("categorical_cross_entropy", type, {low_in({6, 5}, 0.01f, 1), low_out({6, 5})}, [&](const std::vector<Tensor>& t) {
      return ops::categorical_cross_entropy(t[0], labels, t[1]);
    });
    check_op("count_correct", type, {low_in({6, 5})}, [&](const std::vector<Tensor>& t) {
      return static_cast<double>(ops::count_correct(t[0], labels));
    });
  }
  // The master variables' updates take float32 only.
  const Tensor value({4}), low_gradient({4}, DType::BFloat16);
  CHECK_THROWS_WITH(ops::sgd_update({{value, low_gradient, Tensor()}}, ops::scalar(0.1f, Device::CPU), 0.0f, false, 0.0f),
                    Catch::Contains("sgd_update: takes float32 operands") && Catch::Contains("bfloat16 (4,)"));
}
