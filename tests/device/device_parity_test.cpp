// The device under test against the CPU: every op forward and backward on random shapes and on the
// flagship's shapes (within 1e-4, relative to each tensor's magnitude), three SGD steps of the flagship
// (loss and every variable within 1e-3; the biases that a batch normalization cancels do not move on either
// device), three Adam steps (loss, predictions, each variable's whole update), dropout masks
// (identical), element-type conversions and 8-bit images expanded (bit for bit), the ops on bfloat16 and float16 operands and three
// mixed-precision SGD steps (within a few roundings of the 16-bit type), checkpoints moved between the
// devices, asynchronous copies and out-of-memory errors. The device is COHORT_TEST_DEVICE: cuda on a GPU host
// (`ctest -L cuda`), emulated in the CPU suite, which runs this file's own logic where no GPU is.
#include <catch2/catch.hpp>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <tuple>

#include "cohort/core/error.hpp"
#include "cohort/core/seed.hpp"
#include "cohort/data/loader.hpp"
#include "cohort/data/synthetic.hpp"
#include "cohort/nn/zoo.hpp"
#include "cohort/optim/adam.hpp"
#include "cohort/optim/sgd.hpp"
#include "cohort/tensor/allocator.hpp"
#include "cohort/tensor/capture.hpp"
#include "cohort/tensor/copy_stream.hpp"
#include "cohort/tensor/ops.hpp"
#include "cohort/train/checkpoint.hpp"
#include "cohort/train/trainer.hpp"
#include "device/device_under_test.hpp"
#include "test_util.hpp"

using namespace cohort;

namespace {

Device dut() { return device_test::device_under_test(); }

// Where |device - cpu| > tolerance * (|cpu| + rms(cpu)): relative, with the tensor's magnitude as the
// floor where a value is near zero. Empty when none.
std::string difference(const Tensor& cpu, const Tensor& device, double tolerance) {
  const std::vector<float> expected = cpu.to_vector(), actual = device.to_vector();
  const auto beyond = test_util::first_beyond(expected, actual, tolerance);
  if (!beyond) return {};
  return fmt::format("element {} of {}: device {} vs cpu {} (allowed {})", beyond->index, cpu.shape(), actual[beyond->index],
                     expected[beyond->index], beyond->allowed);
}

// Where |device - cpu| > bound. Empty when none.
std::string absolute_difference(const Tensor& cpu, const Tensor& device, double bound) {
  const std::vector<float> expected = cpu.to_vector(), actual = device.to_vector();
  for (std::size_t i = 0; i < expected.size(); ++i)
    if (!(std::abs(static_cast<double>(actual[i]) - expected[i]) <= bound))
      return fmt::format("element {} of {}: device {} vs cpu {} (allowed {})", i, cpu.shape(), actual[i], expected[i],
                         bound);
  return {};
}

// The biases of the layers that a BatchNormalization follows: it subtracts their batch mean again.
std::set<std::string> biases_feeding_batch_normalization(nn::Sequential& model) {
  std::set<std::string> names;
  for (std::size_t i = 0; i + 1 < model.size(); ++i)
    if (model.layer(i + 1).type_name() == "BatchNormalization") names.insert(model.layer(i).name() + "/bias");
  return names;
}

void require_close(const Tensor& cpu, const Tensor& device, double tolerance, const std::string& what) {
  INFO(what);
  REQUIRE(device.device() == dut());
  REQUIRE(cpu.shape() == device.shape());
  const std::string found = difference(cpu, device, tolerance);
  if (!found.empty()) FAIL(found);
}

void require_close(double cpu, double device, double tolerance, const std::string& what) {
  INFO(what);
  REQUIRE(std::abs(cpu - device) <= tolerance * (std::abs(cpu) + 1e-12));
}

constexpr double kOpTolerance = 1e-4;
// The flagship's three Adam steps on an H200 differ by at most 0.0077 (dense/kernel).
constexpr double kAdamUpdateTolerance = 0.05;

// The same values on the CPU and on the device under test.
struct Pair {
  Tensor cpu, device;
};
Pair random(const Shape& shape, std::uint64_t seed, float low = -1.0f, float high = 1.0f) {
  Tensor host = test_util::random_tensor(shape, seed, low, high);
  return {host, host.to(dut())};
}
Pair zeros(const Shape& shape) { return {Tensor(shape), Tensor(shape, dut())}; }
Pair undefined() { return {Tensor(), Tensor()}; }

// Keras padding along one axis: "same" keeps ceil(in / stride), padding split with the extra cell at the
// bottom/right; "valid" takes only whole windows.
struct Axis {
  std::int64_t out, pad_before;
};
Axis axis(std::int64_t size, std::int64_t window, std::int64_t stride, bool same) {
  const std::int64_t out = same ? (size + stride - 1) / stride : (size - window) / stride + 1;
  const std::int64_t total = same ? std::max<std::int64_t>((out - 1) * stride + window - size, 0) : 0;
  return {out, total / 2};
}

Conv2dGeometry conv_geometry(std::int64_t batch, std::int64_t size, std::int64_t in_c, std::int64_t out_c,
                             std::int64_t kernel, std::int64_t stride, bool same) {
  const Axis a = axis(size, kernel, stride, same);
  return {.batch = batch, .in_h = size, .in_w = size, .in_c = in_c, .out_h = a.out, .out_w = a.out, .out_c = out_c,
          .kernel_h = kernel, .kernel_w = kernel, .stride_h = stride, .stride_w = stride, .pad_top = a.pad_before,
          .pad_left = a.pad_before};
}

Pool2dGeometry pool_geometry(std::int64_t batch, std::int64_t size, std::int64_t channels, std::int64_t pool,
                             std::int64_t stride, bool same, PoolMode mode) {
  const Axis a = axis(size, pool, stride, same);
  return {.batch = batch, .in_h = size, .in_w = size, .channels = channels, .out_h = a.out, .out_w = a.out,
          .pool_h = pool, .pool_w = pool, .stride_h = stride, .stride_w = stride, .pad_top = a.pad_before,
          .pad_left = a.pad_before, .mode = mode};
}

}  // namespace

TEST_CASE("the comparison catches a difference just above the tolerance, and NaN", "[ops]") {
  const Tensor cpu = test_util::random_tensor({100}, 1);
  Tensor off = cpu.clone();
  off.data()[37] += 2e-4f * (std::abs(off.data()[37]) + 1.0f);
  CHECK(difference(cpu, off, kOpTolerance).find("element 37 of") == 0);
  off.data()[37] = std::nanf("");
  CHECK(!difference(cpu, off, kOpTolerance).empty());
  CHECK(difference(cpu, cpu.clone(), 0.0).empty());
}

TEST_CASE("elementwise ops and reductions match the CPU", "[ops]") {
  for (const Shape& shape : {Shape{1}, Shape{257, 129}, Shape{0, 3}, Shape{1 << 20}}) {
    INFO(fmt::format("shape {}", shape));
    Pair x = random(shape, 1), y = random(shape, 2), out = zeros(shape);
    ops::axpy(0.75f, x.cpu, y.cpu);
    ops::axpy(0.75f, x.device, y.device);
    require_close(y.cpu, y.device, kOpTolerance, "axpy");
    ops::scale(y.cpu, -1.5f);
    ops::scale(y.device, -1.5f);
    require_close(y.cpu, y.device, kOpTolerance, "scale");
    ops::multiply(x.cpu, y.cpu, out.cpu);
    ops::multiply(x.device, y.device, out.device);
    require_close(out.cpu, out.device, kOpTolerance, "multiply");
    require_close(ops::sum(out.cpu), ops::sum(out.device), 1e-6, "sum");
    require_close(ops::sum_of_squares(out.cpu), ops::sum_of_squares(out.device), 1e-6, "sum_of_squares");
    ops::copy(x.device, out.device);
    require_close(x.cpu, out.device, 0.0, "copy on the device");
    ops::fill(out.cpu, 2.5f);
    ops::fill(out.device, 2.5f);
    require_close(out.cpu, out.device, 0.0, "fill");
    ops::moving_average_update(out.cpu, x.cpu, 0.9f);
    ops::moving_average_update(out.device, x.device, 0.9f);
    require_close(out.cpu, out.device, kOpTolerance, "moving_average_update");
  }
}

TEST_CASE("element-type conversions give the CPU's bits, and NaN stays NaN", "[ops][dtype]") {
  // Every 16-bit pattern, and floats around every rounding boundary: ties, subnormals, overflow.
  std::vector<std::uint16_t> patterns(1 << 16);
  for (std::size_t i = 0; i < patterns.size(); ++i) patterns[i] = static_cast<std::uint16_t>(i);
  std::vector<float> floats = test_util::random_tensor({1 << 16}, 3, -70000.0f, 70000.0f).to_vector();
  for (std::uint32_t bits = 0; bits < (1u << 20); bits += 97) floats.push_back(std::bit_cast<float>(bits << 11));
  const Tensor wide_cpu = Tensor::from_values({static_cast<std::int64_t>(floats.size())}, floats);
  const Tensor wide_device = wide_cpu.to(dut());
  for (DType type : {DType::BFloat16, DType::Float16}) {
    INFO(dtype_name(type));
    const auto narrowed_cpu = wide_cpu.to(type), narrowed_device = wide_device.to(type).to(Device::CPU);
    REQUIRE(narrowed_device.dtype() == type);
    const auto a = narrowed_cpu.to_vector(), b = narrowed_device.to_vector();
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO("float " << floats[i]);
      if (std::isnan(a[i])) REQUIRE(std::isnan(b[i]));
      else REQUIRE(std::bit_cast<std::uint32_t>(a[i]) == std::bit_cast<std::uint32_t>(b[i]));
    }
    Tensor low_cpu(Shape{static_cast<std::int64_t>(patterns.size())}, type);
    std::memcpy(low_cpu.host_bytes().data(), patterns.data(), low_cpu.bytes());
    const auto widened_cpu = low_cpu.to(DType::Float32).to_vector();
    const auto widened_device = low_cpu.to(dut()).to(DType::Float32).to_vector();
    for (std::size_t i = 0; i < patterns.size(); ++i) {
      INFO("pattern " << patterns[i]);
      if (std::isnan(widened_cpu[i])) REQUIRE(std::isnan(widened_device[i]));
      else REQUIRE(std::bit_cast<std::uint32_t>(widened_cpu[i]) == std::bit_cast<std::uint32_t>(widened_device[i]));
    }
  }
  const Tensor labels = Tensor::from_values({4}, std::vector<std::int32_t>{0, 7, -3, 1 << 20});
  CHECK(labels.to(dut()).to(DType::Float32).to_vector() == std::vector<float>{0, 7, -3, 1 << 20});
  CHECK(Tensor({3}, DType::BFloat16, dut()).to_vector() == std::vector<float>(3, 0.0f));
}

TEST_CASE("matrix products match the CPU for every transpose, alpha and beta", "[ops]") {
  struct Case {
    std::int64_t m, n, k;
  };
  for (const Case c : {Case{1, 1, 1}, Case{37, 19, 53}, Case{128, 10, 512}, Case{128, 512, 2048}, Case{5, 7, 0}}) {
    for (int transposes = 0; transposes < 4; ++transposes) {
      const bool ta = transposes & 1, tb = transposes & 2;
      INFO(fmt::format("m {} n {} k {} transpose a {} b {}", c.m, c.n, c.k, ta, tb));
      const Pair a = random(ta ? Shape{c.k, c.m} : Shape{c.m, c.k}, 3), b = random(tb ? Shape{c.n, c.k} : Shape{c.k, c.n}, 4);
      Pair out = random({c.m, c.n}, 5);
      ops::matmul(a.cpu, ta, b.cpu, tb, out.cpu, 0.5f, 2.0f);
      ops::matmul(a.device, ta, b.device, tb, out.device, 0.5f, 2.0f);
      require_close(out.cpu, out.device, kOpTolerance, "matmul alpha 0.5 beta 2");
      ops::matmul(a.cpu, ta, b.cpu, tb, out.cpu);
      ops::matmul(a.device, ta, b.device, tb, out.device);
      require_close(out.cpu, out.device, kOpTolerance, "matmul");
    }
  }
}

TEST_CASE("biases and activations match the CPU forward and backward", "[ops]") {
  for (const Shape& shape : {Shape{64, 33}, Shape{8, 5, 5, 17}, Shape{128, 10}}) {
    INFO(fmt::format("shape {}", shape));
    Pair y = random(shape, 6), dbias = zeros({shape[shape.rank() - 1]});
    const Pair bias = random({shape[shape.rank() - 1]}, 7);
    ops::add_bias(y.cpu, bias.cpu);
    ops::add_bias(y.device, bias.device);
    require_close(y.cpu, y.device, kOpTolerance, "add_bias");
    ops::bias_gradient(y.cpu, dbias.cpu);
    ops::bias_gradient(y.device, dbias.device);
    require_close(dbias.cpu, dbias.device, kOpTolerance, "bias_gradient");
    for (Activation a : {Activation::Linear, Activation::Relu, Activation::Sigmoid, Activation::Tanh, Activation::Softmax}) {
      INFO(fmt::format("activation {}", static_cast<int>(a)));
      const Pair x = random(shape, 8, -4.0f, 4.0f), dy = random(shape, 9);
      Pair out = zeros(shape), dx = zeros(shape);
      ops::activation_forward(a, x.cpu, out.cpu);
      ops::activation_forward(a, x.device, out.device);
      require_close(out.cpu, out.device, kOpTolerance, "activation_forward");
      ops::activation_backward(a, out.cpu, dy.cpu, dx.cpu);
      ops::activation_backward(a, out.cpu.to(dut()), dy.device, dx.device);
      require_close(dx.cpu, dx.device, kOpTolerance, "activation_backward");
      if (a == Activation::Softmax) continue;
      // The bias and the activation in one pass (a Dense layer's output).
      Pair fused{x.cpu.clone(), x.device.clone()};
      ops::bias_activation_forward(fused.cpu, bias.cpu, a);
      ops::bias_activation_forward(fused.device, bias.device, a);
      require_close(fused.cpu, fused.device, kOpTolerance, "bias_activation_forward");
    }
  }
}

TEST_CASE("convolutions match the CPU forward and backward, on the flagship's shapes and odd ones", "[ops]") {
  const std::vector<std::pair<std::string, Conv2dGeometry>> cases = {
      {"flagship conv 1 (3 channels, same)", conv_geometry(4, 32, 3, 32, 3, 1, true)},
      {"flagship conv 2 (valid)", conv_geometry(4, 32, 32, 32, 3, 1, false)},
      {"flagship conv 3", conv_geometry(4, 15, 32, 64, 3, 1, true)},
      {"flagship conv 4", conv_geometry(4, 15, 64, 64, 3, 1, false)},
      {"flagship conv 6", conv_geometry(4, 6, 128, 128, 3, 1, false)},
      {"same, stride 2, even input (asymmetric padding)", conv_geometry(3, 8, 5, 7, 3, 2, true)},
      {"valid, stride 2, cells no window reaches", conv_geometry(2, 10, 4, 6, 3, 2, false)},
      {"1x1", conv_geometry(2, 9, 6, 11, 1, 1, false)},
      {"5x5 same", conv_geometry(2, 7, 3, 5, 5, 1, true)},
      {"batch 1", conv_geometry(1, 5, 2, 3, 3, 1, true)},
  };
  for (const auto& [name, g] : cases) {
    INFO(name);
    const Shape in{g.batch, g.in_h, g.in_w, g.in_c}, out{g.batch, g.out_h, g.out_w, g.out_c};
    const Pair x = random(in, 10), kernel = random({g.kernel_h, g.kernel_w, g.in_c, g.out_c}, 11, -0.3f, 0.3f);
    const Pair bias = random({g.out_c}, 12), dy = random(out, 13);
    Pair y = zeros(out), dx = zeros(in), dkernel = zeros(kernel.cpu.shape()), dbias = zeros({g.out_c});
    Conv2dPlan cpu_plan(g, Device::CPU), device_plan(g, dut());
    ops::conv2d_forward(cpu_plan, x.cpu, kernel.cpu, bias.cpu, y.cpu);
    ops::conv2d_forward(device_plan, x.device, kernel.device, bias.device, y.device);
    require_close(y.cpu, y.device, kOpTolerance, "conv2d_forward");
    ops::conv2d_backward(cpu_plan, x.cpu, kernel.cpu, dy.cpu, dx.cpu, dkernel.cpu, dbias.cpu);
    ops::conv2d_backward(device_plan, x.device, kernel.device, dy.device, dx.device, dkernel.device, dbias.device);
    require_close(dx.cpu, dx.device, kOpTolerance, "conv2d_backward dx");
    require_close(dkernel.cpu, dkernel.device, kOpTolerance, "conv2d_backward dkernel");
    require_close(dbias.cpu, dbias.device, kOpTolerance, "conv2d_backward dbias");
    // The first layer has no input gradient and a layer may have no bias.
    ops::conv2d_forward(device_plan, x.device, kernel.device, Tensor(), y.device);
    ops::conv2d_forward(cpu_plan, x.cpu, kernel.cpu, Tensor(), y.cpu);
    require_close(y.cpu, y.device, kOpTolerance, "conv2d_forward without bias");
    ops::conv2d_backward(device_plan, x.device, kernel.device, dy.device, Tensor(), dkernel.device, Tensor());
    require_close(dkernel.cpu, dkernel.device, kOpTolerance, "conv2d_backward without dx");
    // With the bias and a ReLU in one call (cuDNN's fused convolution where it takes the shape), and an
    // activation without a bias.
    ops::conv2d_activation_forward(cpu_plan, x.cpu, kernel.cpu, bias.cpu, Activation::Relu, y.cpu);
    ops::conv2d_activation_forward(device_plan, x.device, kernel.device, bias.device, Activation::Relu, y.device);
    require_close(y.cpu, y.device, kOpTolerance, "conv2d_forward with bias and relu");
    ops::conv2d_activation_forward(cpu_plan, x.cpu, kernel.cpu, Tensor(), Activation::Sigmoid, y.cpu);
    ops::conv2d_activation_forward(device_plan, x.device, kernel.device, Tensor(), Activation::Sigmoid, y.device);
    require_close(y.cpu, y.device, kOpTolerance, "conv2d_forward with sigmoid");
  }
}

TEST_CASE("pooling matches the CPU forward and backward, windows clipped and overlapping", "[ops]") {
  const std::vector<std::pair<std::string, std::function<Pool2dGeometry(PoolMode)>>> cases = {
      {"flagship 2x2 on 30x30", [](PoolMode m) { return pool_geometry(4, 30, 32, 2, 2, false, m); }},
      {"2x2 stride 2 on odd 7x7", [](PoolMode m) { return pool_geometry(2, 7, 3, 2, 2, false, m); }},
      {"3x3 stride 2 same (overlapping, clipped)", [](PoolMode m) { return pool_geometry(2, 8, 5, 3, 2, true, m); }},
      {"3x3 stride 1 same", [](PoolMode m) { return pool_geometry(2, 5, 4, 3, 1, true, m); }},
  };
  for (const auto& [name, make] : cases) {
    for (PoolMode mode : {PoolMode::Max, PoolMode::Average}) {
      const Pool2dGeometry g = make(mode);
      INFO(fmt::format("{} {}", name, mode == PoolMode::Max ? "max" : "average"));
      const Shape in{g.batch, g.in_h, g.in_w, g.channels}, out{g.batch, g.out_h, g.out_w, g.channels};
      const Pair x = random(in, 14), dy = random(out, 15);
      Pair y = zeros(out), dx = zeros(in);
      Pool2dPlan cpu_plan(g, Device::CPU), device_plan(g, dut());
      ops::pool2d_forward(cpu_plan, x.cpu, y.cpu);
      ops::pool2d_forward(device_plan, x.device, y.device);
      require_close(y.cpu, y.device, kOpTolerance, "pool2d_forward");
      ops::pool2d_backward(cpu_plan, x.cpu, y.cpu, dy.cpu, dx.cpu);
      ops::pool2d_backward(device_plan, x.device, y.device, dy.device, dx.device);
      require_close(dx.cpu, dx.device, kOpTolerance, "pool2d_backward");
    }
  }
}

TEST_CASE("batch normalization matches the CPU in training and inference, forward and backward", "[ops]") {
  for (const Shape& shape : {Shape{4, 30, 30, 32}, Shape{128, 512}, Shape{3, 5, 5, 7}, Shape{1, 1, 1, 3}}) {
    INFO(fmt::format("shape {}", shape));
    const std::int64_t c = shape[shape.rank() - 1];
    BatchNormPlan cpu_plan({.channels = c, .epsilon = 1e-3f}, Device::CPU), device_plan({.channels = c, .epsilon = 1e-3f}, dut());
    const Pair x = random(shape, 16, -2.0f, 3.0f), gamma = random({c}, 17, 0.5f, 1.5f), beta = random({c}, 18);
    const Pair dy = random(shape, 19);
    Pair y = zeros(shape), mean = zeros({c}), variance = zeros({c});
    ops::batch_norm_forward_training(cpu_plan, x.cpu, gamma.cpu, beta.cpu, y.cpu, mean.cpu, variance.cpu);
    ops::batch_norm_forward_training(device_plan, x.device, gamma.device, beta.device, y.device, mean.device, variance.device);
    require_close(y.cpu, y.device, kOpTolerance, "batch_norm_forward_training y");
    require_close(mean.cpu, mean.device, kOpTolerance, "batch mean");
    require_close(variance.cpu, variance.device, kOpTolerance, "batch variance");
    Pair dx = zeros(shape), dgamma = zeros({c}), dbeta = zeros({c});
    ops::batch_norm_backward(cpu_plan, x.cpu, gamma.cpu, dy.cpu, mean.cpu, variance.cpu, dx.cpu, dgamma.cpu, dbeta.cpu);
    ops::batch_norm_backward(device_plan, x.device, gamma.device, dy.device, mean.device, variance.device, dx.device,
                             dgamma.device, dbeta.device);
    require_close(dx.cpu, dx.device, kOpTolerance, "batch_norm_backward dx");
    require_close(dgamma.cpu, dgamma.device, kOpTolerance, "batch_norm_backward dgamma");
    require_close(dbeta.cpu, dbeta.device, kOpTolerance, "batch_norm_backward dbeta");
    ops::batch_norm_forward_inference(cpu_plan, x.cpu, gamma.cpu, beta.cpu, mean.cpu, variance.cpu, y.cpu);
    ops::batch_norm_forward_inference(device_plan, x.device, gamma.device, beta.device, mean.device, variance.device, y.device);
    require_close(y.cpu, y.device, kOpTolerance, "batch_norm_forward_inference");
    ops::batch_norm_backward_inference(cpu_plan, x.cpu, gamma.cpu, dy.cpu, mean.cpu, variance.cpu, dx.cpu, dgamma.cpu,
                                       dbeta.cpu);
    ops::batch_norm_backward_inference(device_plan, x.device, gamma.device, dy.device, mean.device, variance.device,
                                       dx.device, dgamma.device, dbeta.device);
    require_close(dx.cpu, dx.device, kOpTolerance, "batch_norm_backward_inference dx");
    require_close(dgamma.cpu, dgamma.device, kOpTolerance, "batch_norm_backward_inference dgamma");
    // With the activation after it fused: one pass forward, its gradient taken inside the backward passes.
    for (Activation a : {Activation::Relu, Activation::Sigmoid}) {
      INFO(activation_name(a));
      ops::batch_norm_activation_forward_training(cpu_plan, x.cpu, gamma.cpu, beta.cpu, a, y.cpu, mean.cpu, variance.cpu);
      ops::batch_norm_activation_forward_training(device_plan, x.device, gamma.device, beta.device, a, y.device,
                                                  mean.device, variance.device);
      require_close(y.cpu, y.device, kOpTolerance, "batch_norm_activation_forward_training");
      ops::batch_norm_activation_backward(cpu_plan, x.cpu, y.cpu, gamma.cpu, beta.cpu, dy.cpu, mean.cpu, variance.cpu, a,
                                          dx.cpu, dgamma.cpu, dbeta.cpu);
      ops::batch_norm_activation_backward(device_plan, x.device, y.device, gamma.device, beta.device, dy.device,
                                          mean.device, variance.device, a, dx.device, dgamma.device, dbeta.device);
      require_close(dx.cpu, dx.device, kOpTolerance, "batch_norm_activation_backward dx");
      require_close(dgamma.cpu, dgamma.device, kOpTolerance, "batch_norm_activation_backward dgamma");
      require_close(dbeta.cpu, dbeta.device, kOpTolerance, "batch_norm_activation_backward dbeta");
      ops::batch_norm_activation_forward_inference(cpu_plan, x.cpu, gamma.cpu, beta.cpu, mean.cpu, variance.cpu, a, y.cpu);
      ops::batch_norm_activation_forward_inference(device_plan, x.device, gamma.device, beta.device, mean.device,
                                                   variance.device, a, y.device);
      require_close(y.cpu, y.device, kOpTolerance, "batch_norm_activation_forward_inference");
    }
  }
}

namespace {

using test_util::low_in, test_util::low_out, test_util::wide_in, test_util::wide_out, test_util::Operand16;

// Runs `op` on the CPU and on the device under test from the same operands, 16-bit ones of `type`; every
// output must have the CPU's type and lie within a few roundings of that type of the CPU's values (the
// device may round a kernel's result at other points than the CPU's kernels do).
void check_16_bit(const std::string& name, DType type, const std::vector<Operand16>& operands,
                  const std::function<void(const std::vector<Tensor>&, Device)>& op) {
  INFO(name << " in " << dtype_name(type));
  std::vector<Tensor> cpu, device;
  for (std::size_t i = 0; i < operands.size(); ++i) {
    const Operand16& o = operands[i];
    const Tensor values = test_util::random_tensor(o.shape, 200 + i, o.min, o.max);
    cpu.push_back(o.low ? values.to(type) : values);
    device.push_back(cpu.back().to(dut()));
  }
  op(cpu, Device::CPU);
  op(device, dut());
  for (std::size_t i = 0; i < operands.size(); ++i) {
    if (!operands[i].output) continue;
    INFO("output " << i);
    REQUIRE(device[i].dtype() == cpu[i].dtype());
    const std::string found = difference(cpu[i].to(DType::Float32), device[i].to(DType::Float32), 8 * unit_roundoff(type));
    if (!found.empty()) FAIL(found);
  }
}

}  // namespace

TEST_CASE("16-bit elementwise ops, products and dropout give the CPU's results", "[ops][dtype]") {
  for (DType type : {DType::BFloat16, DType::Float16}) {
    const Shape shape{129, 37};
    check_16_bit("multiply", type, {low_in(shape), low_in(shape), low_out(shape)},
                 [](const std::vector<Tensor>& t, Device) { ops::multiply(t[0], t[1], t[2]); });
    for (Activation activation : {Activation::Relu, Activation::Sigmoid, Activation::Tanh}) {
      check_16_bit(fmt::format("{} forward", activation_name(activation)), type, {low_in(shape, -3, 3), low_out(shape)},
                   [&](const std::vector<Tensor>& t, Device) { ops::activation_forward(activation, t[0], t[1]); });
      check_16_bit(fmt::format("{} backward", activation_name(activation)), type,
                   {low_in(shape, 0.01f, 0.99f), low_in(shape), low_out(shape)},
                   [&](const std::vector<Tensor>& t, Device) { ops::activation_backward(activation, t[0], t[1], t[2]); });
    }
    for (bool transpose_a : {false, true})
      for (bool transpose_b : {false, true}) {
        const Shape a = transpose_a ? Shape{70, 33} : Shape{33, 70}, b = transpose_b ? Shape{17, 70} : Shape{70, 17};
        check_16_bit(fmt::format("matmul{}{}", transpose_a ? " a^T" : "", transpose_b ? " b^T" : ""), type,
                     {low_in(a), low_in(b), low_out({33, 17})}, [&](const std::vector<Tensor>& t, Device) {
                       ops::matmul(t[0], transpose_a, t[1], transpose_b, t[2], 1.0f, 0.5f);
                     });
        // A weight gradient: 16-bit factors, a float32 product.
        check_16_bit("matmul into float32", type, {low_in(a), low_in(b), wide_out({33, 17})},
                     [&](const std::vector<Tensor>& t, Device) { ops::matmul(t[0], transpose_a, t[1], transpose_b, t[2]); });
      }
    // An inner dimension of 0: C = beta * C, which cuBLAS cannot be asked for.
    for (const float beta : {0.0f, 0.5f})
      check_16_bit(fmt::format("matmul of an empty inner dimension, beta {}", beta), type,
                   {low_in({33, 0}), low_in({0, 17}), low_out({33, 17})},
                   [&](const std::vector<Tensor>& t, Device) { ops::matmul(t[0], false, t[1], false, t[2], 1.0f, beta); });
    check_16_bit("dropout mask", type, {low_out({1000, 7})},
                 [](const std::vector<Tensor>& t, Device) { ops::dropout_mask(t[0], 0.3f, 99); });
  }
}

TEST_CASE("16-bit convolutions, pooling and batch normalization give the CPU's results", "[ops][dtype]") {
  for (DType type : {DType::BFloat16, DType::Float16}) {
    for (const Conv2dGeometry& g : {conv_geometry(4, 32, 32, 32, 3, 1, false), conv_geometry(4, 32, 3, 32, 3, 1, true),
                                    conv_geometry(3, 8, 5, 7, 3, 2, true), conv_geometry(2, 9, 6, 11, 1, 1, false)}) {
      const Shape x{g.batch, g.in_h, g.in_w, g.in_c}, k{g.kernel_h, g.kernel_w, g.in_c, g.out_c},
          y{g.batch, g.out_h, g.out_w, g.out_c};
      const std::string shape = fmt::format("conv {}x{}x{} to {}, stride {}", g.in_h, g.in_w, g.in_c, g.out_c, g.stride_h);
      check_16_bit(shape + " forward, float32 bias, relu", type, {low_in(x), low_in(k, -0.3f, 0.3f), wide_in({g.out_c}), low_out(y)},
                   [&](const std::vector<Tensor>& t, Device device) {
                     Conv2dPlan plan(g, device);
                     ops::conv2d_activation_forward(plan, t[0], t[1], t[2], Activation::Relu, t[3]);
                   });
      check_16_bit(shape + " backward", type,
                   {low_in(x), low_in(k, -0.3f, 0.3f), low_in(y), low_out(x), wide_out(k), wide_out({g.out_c})},
                   [&](const std::vector<Tensor>& t, Device device) {
                     Conv2dPlan plan(g, device);
                     ops::conv2d_backward(plan, t[0], t[1], t[2], t[3], t[4], t[5]);
                   });
    }
    for (const Pool2dGeometry& g : {pool_geometry(4, 30, 32, 2, 2, false, PoolMode::Max),
                                    pool_geometry(2, 8, 5, 3, 2, true, PoolMode::Max)}) {
      const Shape x{g.batch, g.in_h, g.in_w, g.channels}, y{g.batch, g.out_h, g.out_w, g.channels};
      // The backward pass takes the forward's own output, so that the maxima are found again.
      check_16_bit(fmt::format("max pooling {}x{} on {}x{}", g.pool_h, g.pool_w, g.in_h, g.in_w), type,
                   {low_in(x), low_out(y), low_in(y), low_out(x)}, [&](const std::vector<Tensor>& t, Device device) {
                     Pool2dPlan plan(g, device);
                     ops::pool2d_forward(plan, t[0], t[1]);
                     ops::pool2d_backward(plan, t[0], t[1], t[2], t[3]);
                   });
    }
    for (const Shape& x : {Shape{4, 30, 30, 32}, Shape{3, 5, 5, 7}}) {
      const std::int64_t channels = x[3];
      const Shape c{channels};
      const BatchNormGeometry g{.channels = channels, .epsilon = 1e-3f};
      check_16_bit(fmt::format("batch normalization of {} in training, relu", x), type,
                   {low_in(x, -2, 3), wide_in(c, 0.5f, 1.5f), wide_in(c), low_out(x), wide_out(c), wide_out(c), low_in(x),
                    low_out(x), wide_out(c), wide_out(c)},
                   [&](const std::vector<Tensor>& t, Device device) {
                     BatchNormPlan plan(g, device);
                     ops::batch_norm_activation_forward_training(plan, t[0], t[1], t[2], Activation::Relu, t[3], t[4], t[5]);
                     ops::batch_norm_activation_backward(plan, t[0], t[3], t[1], t[2], t[6], t[4], t[5], Activation::Relu,
                                                         t[7], t[8], t[9]);
                   });
      check_16_bit(fmt::format("batch normalization of {} in inference", x), type,
                   {low_in(x, -2, 3), wide_in(c, 0.5f, 1.5f), wide_in(c), wide_in(c), wide_in(c, 0.5f, 2), low_out(x),
                    low_in(x), low_out(x), wide_out(c), wide_out(c)},
                   [&](const std::vector<Tensor>& t, Device device) {
                     BatchNormPlan plan(g, device);
                     ops::batch_norm_forward_inference(plan, t[0], t[1], t[2], t[3], t[4], t[5]);
                     ops::batch_norm_backward_inference(plan, t[0], t[1], t[6], t[3], t[4], t[7], t[8], t[9]);
                   });
    }
  }
}

TEST_CASE("optimizer updates of many variables at once match the CPU over several steps", "[ops]") {
  // More variables than one launch takes, of sizes from 1 element to a million.
  struct Variable {
    Pair w, v, m, s, mg;
  };
  std::vector<Variable> variables;
  for (std::int64_t i = 0; i < 40; ++i) {
    const Shape shape{i == 7 ? std::int64_t{1} << 20 : 1 + i * 37};
    variables.push_back({random(shape, 20 + static_cast<std::uint64_t>(i)), zeros(shape), zeros(shape), zeros(shape), zeros(shape)});
  }
  for (int step = 0; step < 3; ++step) {
    for (bool on_device : {false, true}) {
      const auto pick = [&](const Pair& p) { return on_device ? p.device : p.cpu; };
      std::vector<ops::SgdOperands> sgd, plain_sgd;
      std::vector<ops::AdamOperands> adam;
      std::vector<ops::RmspropOperands> rmsprop;
      for (std::size_t i = 0; i < variables.size(); ++i) {
        const Variable& x = variables[i];
        const Pair g = random(x.w.cpu.shape(), 100 * static_cast<std::uint64_t>(step) + i);
        sgd.push_back({pick(x.w), pick(g), pick(x.v)});
        plain_sgd.push_back({pick(x.w), pick(g), Tensor()});
        adam.push_back({pick(x.w), pick(g), pick(x.m), pick(x.s)});
        rmsprop.push_back({pick(x.w), pick(g), pick(x.s), pick(x.mg), pick(x.v)});
      }
      const auto rate = [&](float value) { return ops::scalar(value, on_device ? dut() : Device::CPU); };
      ops::sgd_update(sgd, rate(0.1f), 0.9f, step == 1, 1e-4f);
      ops::sgd_update(plain_sgd, rate(0.05f), 0.0f, false, 0.0f);
      ops::adam_update(adam, rate(1e-3f), 0.9f, 0.999f, 1e-7f, 0.0f);
      ops::rmsprop_update(rmsprop, rate(1e-3f), 0.9f, 0.5f, 1e-7f, 1e-4f);
    }
  }
  for (const Variable& x : variables) {
    require_close(x.w.cpu, x.w.device, kOpTolerance, "weights");
    require_close(x.m.cpu, x.m.device, kOpTolerance, "Adam m");
    require_close(x.s.cpu, x.s.device, kOpTolerance, "second moments");
    require_close(x.v.cpu, x.v.device, kOpTolerance, "velocity");
  }
}

TEST_CASE("losses and accuracy match the CPU for class indices and targets", "[ops]") {
  const std::int64_t rows = 67, classes = 10;
  const Pair logits = random({rows, classes}, 30, -5.0f, 5.0f);
  Tensor sparse({rows}), dense({rows, classes});
  for (std::int64_t r = 0; r < rows; ++r) {
    sparse.data()[r] = static_cast<float>((r * 7) % classes);
    dense.data()[r * classes + (r * 3) % classes] = 0.75f;
    dense.data()[r * classes + (r * 5 + 1) % classes] += 0.25f;
  }
  Pair probabilities = zeros({rows, classes});
  ops::activation_forward(Activation::Softmax, logits.cpu, probabilities.cpu);
  ops::activation_forward(Activation::Softmax, logits.device, probabilities.device);
  for (const Tensor& labels : {sparse, dense}) {
    INFO(fmt::format("labels {}", labels.shape()));
    const Tensor device_labels = labels.to(dut());
    Pair dlogits = zeros({rows, classes}), dprobabilities = zeros({rows, classes});
    require_close(ops::softmax_cross_entropy(logits.cpu, labels, dlogits.cpu),
                  ops::softmax_cross_entropy(logits.device, device_labels, dlogits.device), 1e-5, "softmax_cross_entropy");
    require_close(dlogits.cpu, dlogits.device, kOpTolerance, "dlogits");
    require_close(ops::categorical_cross_entropy(probabilities.cpu, labels, dprobabilities.cpu),
                  ops::categorical_cross_entropy(probabilities.device, device_labels, dprobabilities.device), 1e-5,
                  "categorical_cross_entropy");
    require_close(dprobabilities.cpu, dprobabilities.device, kOpTolerance, "dprobabilities");
    CHECK(ops::count_correct(logits.cpu, labels) == ops::count_correct(logits.device, device_labels));
  }
  Tensor bad = sparse.clone();
  bad.data()[1] = 12.0f;
  CHECK_THROWS_WITH(ops::softmax_cross_entropy(logits.device, bad.to(dut()), Tensor()),
                    Catch::Contains("label 12 of row 1 is not a class index in [0, 10)"));
}

TEST_CASE("running sums add losses and counts over batches on the device and read them once", "[ops]") {
  const std::int64_t classes = 10;
  RunningSums on_cpu(Device::CPU, 3), on_device(dut(), 3);
  REQUIRE(on_device.device() == dut());
  std::vector<Tensor> cpu_labels;
  for (std::int64_t batch = 0; batch < 3; ++batch) {
    const std::int64_t rows = 40 + 300 * batch;  // one row per thread and many
    const Pair logits = random({rows, classes}, 60 + static_cast<std::uint64_t>(batch), -5.0f, 5.0f);
    Tensor labels({rows});
    for (std::int64_t r = 0; r < rows; ++r) labels.data()[r] = static_cast<float>((r * 3 + batch) % classes);
    const Tensor device_labels = labels.to(dut());
    Pair probabilities = zeros({rows, classes}), dlogits = zeros({rows, classes});
    ops::activation_forward(Activation::Softmax, logits.cpu, probabilities.cpu);
    ops::activation_forward(Activation::Softmax, logits.device, probabilities.device);
    ops::softmax_cross_entropy(logits.cpu, labels, dlogits.cpu, on_cpu, 0);
    ops::softmax_cross_entropy(logits.device, device_labels, dlogits.device, on_device, 0);
    require_close(dlogits.cpu, dlogits.device, kOpTolerance, "dlogits");
    ops::categorical_cross_entropy(probabilities.cpu, labels, Tensor(), on_cpu, 1);
    ops::categorical_cross_entropy(probabilities.device, device_labels, Tensor(), on_device, 1);
    ops::count_correct(logits.cpu, labels, on_cpu, 2);
    ops::count_correct(logits.device, device_labels, on_device, 2);
    on_device.add(2, 1.0);  // a host value joins the device's
  }
  const std::vector<double> expected = on_cpu.read(), got = on_device.read();
  REQUIRE(got.size() == 3);
  require_close(expected[0], got[0], 1e-5, "summed softmax cross-entropy");
  require_close(expected[1], got[1], 1e-5, "summed categorical cross-entropy");
  CHECK(got[2] == expected[2] + 3.0);
  CHECK(on_device.read() == got);  // reading leaves them as they are
  on_device.reset();
  CHECK(on_device.read() == std::vector<double>(3, 0.0));
  // A bad label is reported, by the op or at the latest by the next read, naming the first one; the rows past
  // one block's threads count too. A device that reports at the next read zeroes the bad rows' gradients.
  const std::int64_t rows = 300;
  const Pair logits = random({rows, classes}, 70);
  Tensor labels({rows}), later({rows});
  labels.data()[280] = 11.0f;
  labels.data()[290] = 12.0f;
  later.data()[1] = 13.0f;
  Pair dlogits{Tensor::full({rows, classes}, 7.0f), Tensor::full({rows, classes}, 7.0f).to(dut())};
  const auto add_and_read = [&](const Tensor& bad) {
    ops::softmax_cross_entropy(logits.device, bad.to(dut()), dlogits.device, on_device, 0);
    on_device.read();
  };
  CHECK_THROWS_WITH(add_and_read(labels), Catch::Contains("label 11 of row 280 is not a class index in [0, 10)"));
  if (dut() == Device::CUDA) {
    const std::vector<float> gradient = dlogits.device.to_vector();
    for (std::int64_t r : {280, 290})
      for (std::int64_t j = 0; j < classes; ++j) CHECK(gradient[static_cast<std::size_t>(r * classes + j)] == 0.0f);
  }
  // Until a reset, the first bad label stays the one reported (a CPU-like device reports each batch's at once).
  CHECK_THROWS_WITH(add_and_read(later), Catch::Contains(dut() == Device::CUDA ? "label 11 of row 280" : "label 13 of row 1"));
  on_device.reset();
  CHECK_NOTHROW(on_device.read());
  CHECK_THROWS_WITH(ops::count_correct(logits.device, labels.to(dut()), RunningSums(Device::CPU, 1), 0),
                    Catch::Contains("running sums on cpu"));
  CHECK_THROWS_WITH(ops::count_correct(logits.device, labels.to(dut()), on_device, 3), Catch::Contains("slot 3"));
}

TEST_CASE("element-wise losses and top-k counts add on the device what they add on the CPU", "[ops]") {
  const std::int64_t rows = 300, outputs = 3;  // past one block's threads
  const Pair logits = random({rows, outputs}, 80, -6.0f, 6.0f);
  Tensor host_probabilities = test_util::random_tensor({rows, outputs}, 81, 0.0f, 1.0f);
  host_probabilities.data()[0] = 0.0f;  // clipped to 1e-7 and 1 - 1e-7, where the gradient is zero
  host_probabilities.data()[1] = 1.0f;
  const Pair clipped{host_probabilities, host_probabilities.to(dut())};
  Tensor targets({rows, outputs});
  for (std::int64_t i = 0; i < targets.numel(); ++i) targets.data()[i] = i % 4 == 0 ? 0.25f : static_cast<float>(i % 2);
  const Tensor device_targets = targets.to(dut());
  const std::vector<std::pair<ElementwiseLoss, const Pair*>> cases = {
      {ElementwiseLoss::SquaredError, &logits},       {ElementwiseLoss::AbsoluteError, &logits},
      {ElementwiseLoss::BinaryCrossEntropy, &clipped}, {ElementwiseLoss::BinaryCrossEntropyOfLogits, &logits},
      {ElementwiseLoss::BinaryHits, &clipped},         {ElementwiseLoss::BinaryHitsOfLogits, &logits}};
  RunningSums on_cpu(Device::CPU, 2), on_device(dut(), 2);
  for (const auto& [loss, prediction] : cases) {
    INFO("element-wise loss " << static_cast<int>(loss));
    on_cpu.reset();
    on_device.reset();
    Pair gradient = zeros({rows, outputs});
    for (int batch = 0; batch < 2; ++batch) {
      ops::elementwise_loss(loss, prediction->cpu, targets, gradient.cpu, on_cpu, 0);
      ops::elementwise_loss(loss, prediction->device, device_targets, gradient.device, on_device, 0);
    }
    require_close(gradient.cpu, gradient.device, kOpTolerance, "gradient");
    require_close(on_cpu.read()[0], on_device.read()[0], 1e-6, "summed loss");
  }
  // One output per row with int32 targets, one per row; rows of an image each; bfloat16 predictions and
  // gradients. Each case: the prediction, its targets, the tolerance of the gradient.
  const Pair column = random({rows, 1}, 82);
  std::vector<std::int32_t> classes_of_rows(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) classes_of_rows[static_cast<std::size_t>(r)] = static_cast<std::int32_t>(r % 2);
  const Pair wide = random({3, 5000}, 83, -3.0f, 3.0f);
  const Tensor wide_targets = test_util::random_tensor({3, 5000}, 84);
  const Pair narrow{logits.cpu.to(DType::BFloat16), logits.device.to(DType::BFloat16)};
  const std::vector<std::tuple<const char*, const Pair*, Tensor, double>> shapes = {
      {"(N, 1) against (N) int32", &column, Tensor::from_values({rows}, classes_of_rows), kOpTolerance},
      {"rows of 5000 outputs", &wide, wide_targets, kOpTolerance},
      {"bfloat16", &narrow, targets, 1e-2}};
  for (const auto& [what, prediction, shape_targets, tolerance] : shapes) {
    INFO(what);
    for (const ElementwiseLoss loss : {ElementwiseLoss::BinaryCrossEntropyOfLogits, ElementwiseLoss::SquaredError,
                                       ElementwiseLoss::BinaryHitsOfLogits}) {
      on_cpu.reset();
      on_device.reset();
      const DType type = prediction->cpu.dtype();
      Pair gradient{Tensor(prediction->cpu.shape(), type), Tensor(prediction->cpu.shape(), type, dut())};
      ops::elementwise_loss(loss, prediction->cpu, shape_targets, gradient.cpu, on_cpu, 1);
      ops::elementwise_loss(loss, prediction->device, shape_targets.to(dut()), gradient.device, on_device, 1);
      require_close(gradient.cpu.to(DType::Float32), gradient.device.to(DType::Float32), tolerance, "gradient");
      require_close(on_cpu.read()[1], on_device.read()[1], 1e-6, "summed loss");
    }
  }

  // Top-k over scores with ties (ties count against the label), sparse labels and one-hot targets.
  const std::int64_t classes = 6;
  Tensor scores({rows, classes}), labels({rows}), one_hot({rows, classes});
  for (std::int64_t i = 0; i < scores.numel(); ++i) scores.data()[i] = static_cast<float>((i * 7) % 5);
  scores.data()[0] = NAN;  // row 0's label scores NaN: in no top k
  for (std::int64_t r = 0; r < rows; ++r) {
    labels.data()[r] = static_cast<float>((r * 5) % classes);
    one_hot.data()[r * classes + (r * 5) % classes] = 1.0f;
  }
  const Tensor device_scores = scores.to(dut());
  for (const int k : {1, 2, 5}) {
    on_cpu.reset();
    on_device.reset();
    ops::count_top_k(scores, labels, k, on_cpu, 0);
    ops::count_top_k(device_scores, labels.to(dut()), k, on_device, 0);
    ops::count_top_k(scores, one_hot, k, on_cpu, 1);
    ops::count_top_k(device_scores, one_hot.to(dut()), k, on_device, 1);
    CHECK(on_device.read() == on_cpu.read());
    CHECK(on_cpu.read()[0] == on_cpu.read()[1]);
  }
  labels.data()[290] = 6.0f;
  CHECK_THROWS_WITH(([&] {
                      ops::count_top_k(device_scores, labels.to(dut()), 2, on_device, 0);
                      on_device.read();
                    }()),
                    Catch::Contains("label 6 of row 290 is not a class index in [0, 6)"));
}

TEST_CASE("dropout masks are those of the CPU, element for element, for any seed", "[ops][dropout]") {
  for (const std::uint64_t seed : {0ull, 1ull, 123456789ull}) {
    Pair mask = zeros({1000, 7});
    ops::dropout_mask(mask.cpu, 0.3f, seed);
    ops::dropout_mask(mask.device, 0.3f, seed);
    require_close(mask.cpu, mask.device, 0.0, fmt::format("mask of seed {}", seed));
    const Tensor again({1000, 7}, dut());
    ops::dropout_mask(again, 0.3f, seed);
    CHECK(again.to_vector() == mask.device.to_vector());
  }
}

TEST_CASE("a dropout mask drawn from a step counter on the device is the mask of the step's seed",
          "[ops][dropout][capture]") {
  const Tensor step = ops::step_counter(dut());
  for (const std::uint64_t at : {0ull, 7ull, (1ull << 40) + 3}) {
    ops::set_step_counter(step, [&] { return at; });
    Pair mask = zeros({513, 3});
    ops::dropout_mask(mask.cpu, 0.25f, derive_seed(42, at));
    ops::dropout_mask(mask.device, 0.25f, 42, step);
    require_close(mask.cpu, mask.device, 0.0, fmt::format("mask at step {}", at));
  }
}

TEST_CASE("8-bit images expand on the device to the CPU's bits: crop, flip and normalization", "[ops][data]") {
  const auto set = data::make_synthetic({.samples = 70, .sample_shape = {32, 32, 3}, .classes = 10, .seed = 5});
  const data::ImageAugmentation augmentation{
      .crop_padding = 4, .flip_horizontal = true, .mean = {0.49f, 0.48f, 0.45f}, .stddev = {0.25f, 0.24f, 0.26f}};
  const data::DataLoader loader(set, {.batch_size = 32, .seed = 1, .pinned = true, .byte_images = augmentation});
  const data::DataLoader indices(set, {.batch_size = 32, .seed = 1, .byte_images = augmentation, .sample_indices_only = true});
  const data::ImageExpander on_cpu(augmentation, 3, Device::CPU), on_device(augmentation, 3, dut());
  const Tensor resident = data::stored_images(set, dut());
  auto epoch = loader.epoch(0);
  auto index_epoch = indices.epoch(0);
  int batches = 0;
  while (auto batch = epoch->next()) {
    const auto indexed = index_epoch->next();
    REQUIRE(indexed);
    const Tensor expected = on_cpu(batch->images, {}, batch->draws);
    const Tensor got = on_device(batch->images.to(dut()), {}, batch->draws.to(dut()));
    REQUIRE(got.device() == dut());
    const auto bits = [](const Tensor& t) {
      const Tensor host = t.to(Device::CPU);
      return std::vector<std::byte>(host.host_bytes().begin(), host.host_bytes().end());
    };
    CHECK(bits(got) == bits(expected));
    const Tensor from_resident = on_device(resident, indexed->indices.to(dut()), indexed->draws.to(dut()));
    CHECK(bits(from_resident) == bits(expected));
    ++batches;
  }
  CHECK(batches == 3);  // the last one short
  // A device does not check indices (that would cost a read-back): one past the set gives zeros, not a stray read.
  const Tensor stray = on_device(resident, Tensor::from_values({2}, std::vector<std::int32_t>{70, 3}).to(dut()),
                                 Tensor({2, 3}, DType::Int32).to(dut()));
  const std::vector<float> values = stray.to_vector();
  CHECK(std::all_of(values.begin(), values.begin() + 32 * 32 * 3, [](float v) { return v == 0.0f; }));
  CHECK_FALSE(std::all_of(values.begin() + 32 * 32 * 3, values.end(), [](float v) { return v == 0.0f; }));
}

// Three training steps of the flagship from the same start on the CPU and on the device under test.
struct ThreeSteps {
  std::map<std::string, Tensor> start;
  nn::Sequential cpu, device;
  double cpu_loss = 0, device_loss = 0;
  Tensor cpu_prediction, device_prediction;
};

template <typename MakeOptimizer>
ThreeSteps three_steps(MakeOptimizer make_optimizer, nn::Precision precision = nn::Precision::Float32) {
  const auto set = data::make_synthetic({.samples = 48, .sample_shape = {32, 32, 3}, .classes = 10, .seed = 7});
  const train::FitOptions fit{.epochs = 1, .max_steps = 3, .batch_size = 16, .seed = 2,
                              .verbosity = train::Verbosity::Silent};
  const Tensor images = test_util::random_tensor({5, 32, 32, 3}, 3);
  ThreeSteps run{{}, nn::cifar10_cnn({32, 32, 3}, 11), nn::cifar10_cnn({32, 32, 3}, 11, dut())};
  run.cpu.set_precision(precision);
  run.device.set_precision(precision);
  for (const auto& v : run.cpu.variables()) run.start.emplace(v->name, v->value.clone());
  Trainer cpu_trainer(run.cpu, make_optimizer()), device_trainer(run.device, make_optimizer());
  run.cpu_loss = cpu_trainer.fit(set, fit).epochs.back().at("loss");
  run.device_loss = device_trainer.fit(set, fit).epochs.back().at("loss");
  run.cpu_prediction = cpu_trainer.predict(images);
  run.device_prediction = device_trainer.predict(images).to(dut());
  return run;
}

// ||update on the device - update on the CPU|| / ||update on the CPU||, the updates taken from `start`.
double update_difference(const Tensor& start, const Tensor& cpu, const Tensor& device) {
  const std::vector<float> s = start.to_vector(), c = cpu.to_vector(), d = device.to_vector();
  double difference = 0, update = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const double cpu_update = static_cast<double>(c[i]) - s[i], device_update = static_cast<double>(d[i]) - s[i];
    difference += (device_update - cpu_update) * (device_update - cpu_update);
    update += cpu_update * cpu_update;
  }
  return std::sqrt(difference / std::max(update, 1e-300));
}

// A bias that a BatchNormalization follows has a gradient of exactly zero (the batch's mean cancels it), so
// it stays where it started on both devices.
TEST_CASE("three SGD steps of the flagship give the CPU's loss and variables", "[training]") {
  ThreeSteps run = three_steps([] { return optim::SGD({.learning_rate = optim::constant(0.01), .momentum = 0.9}); });
  require_close(run.cpu_loss, run.device_loss, 1e-4, "loss");
  require_close(run.cpu_prediction, run.device_prediction, 1e-3, "predict");
  const std::set<std::string> cancelled = biases_feeding_batch_normalization(run.cpu);
  CHECK(cancelled.size() == 6);
  std::vector<std::string> differences;
  for (const auto& v : run.cpu.variables()) {
    const Tensor& device_value = run.device.variable(v->name)->value;
    const std::string found = cancelled.contains(v->name) ? absolute_difference(run.start.at(v->name), device_value, 0.0) +
                                                                absolute_difference(run.start.at(v->name), v->value, 0.0)
                                                          : difference(v->value, device_value, 1e-3);
    if (!found.empty()) differences.push_back(v->name + ": " + found);
  }
  INFO(fmt::format("{}", fmt::join(differences, "\n")));
  CHECK(differences.empty());
}

// Adam divides each gradient by its own running magnitude, so an element whose gradient is mostly rounding
// (a nearly dead unit) takes a step of up to the learning rate either way: elements may differ where the
// whole update of a variable does not.
TEST_CASE("three Adam steps of the flagship give the CPU's loss, predictions and updates", "[training]") {
  ThreeSteps run = three_steps([] { return optim::Adam(); });
  require_close(run.cpu_loss, run.device_loss, 1e-3, "loss");
  require_close(run.cpu_prediction, run.device_prediction, 1e-3, "predict");
  const std::set<std::string> cancelled = biases_feeding_batch_normalization(run.cpu);
  std::vector<std::string> differences;
  for (const auto& v : run.cpu.variables()) {
    const Tensor& device_value = run.device.variable(v->name)->value;
    if (cancelled.contains(v->name)) {
      // A gradient of exactly zero: Adam does not move it either.
      const std::string found = absolute_difference(run.start.at(v->name), device_value, 0.0) +
                                absolute_difference(run.start.at(v->name), v->value, 0.0);
      if (!found.empty()) differences.push_back(v->name + ": " + found);
    } else if (const double relative = update_difference(run.start.at(v->name), v->value, device_value);
               !(relative <= kAdamUpdateTolerance)) {
      differences.push_back(fmt::format("{}: the update differs by {:.3g} of its norm", v->name, relative));
    }
  }
  INFO(fmt::format("{}", fmt::join(differences, "\n")));
  CHECK(differences.empty());
}

// In mixed precision the device rounds its 16-bit activations at other points than the CPU's kernels (a
// convolution's bias after the convolution, a kernel gradient to the 16-bit type before it widens), so the
// steps agree to that type's rounding rather than float32's.
TEST_CASE("three SGD steps of the flagship in mixed precision give the CPU's loss, predictions and updates",
          "[training][dtype]") {
  for (const auto [precision, type] : {std::pair{nn::Precision::MixedBFloat16, DType::BFloat16},
                                       std::pair{nn::Precision::MixedFloat16, DType::Float16}}) {
    INFO(nn::precision_name(precision));
    ThreeSteps run = three_steps([] { return optim::SGD({.learning_rate = optim::constant(0.01), .momentum = 0.9}); },
                                 precision);
    require_close(run.cpu_loss, run.device_loss, 16 * unit_roundoff(type), "loss");
    require_close(run.cpu_prediction, run.device_prediction, 16 * unit_roundoff(type), "predict");
    const std::set<std::string> cancelled = biases_feeding_batch_normalization(run.cpu);
    std::vector<std::string> differences;
    std::size_t moved = 0;  // a step that every replica skipped (a float16 overflow) moves nothing
    for (const auto& v : run.cpu.variables()) {
      const Tensor& device_value = run.device.variable(v->name)->value;
      REQUIRE(device_value.dtype() == DType::Float32);
      if (cancelled.contains(v->name)) {  // a gradient of exactly zero on both devices
        CHECK(v->value.to_vector() == run.start.at(v->name).to_vector());
        CHECK(device_value.to_vector() == run.start.at(v->name).to_vector());
        continue;
      }
      if (v->value.to_vector() != run.start.at(v->name).to_vector()) ++moved;
      if (const double relative = update_difference(run.start.at(v->name), v->value, device_value); !(relative <= 0.1))
        differences.push_back(fmt::format("{}: the update differs by {:.3g} of its norm", v->name, relative));
    }
    CHECK(moved == run.cpu.variables().size() - cancelled.size());
    INFO(fmt::format("{}", fmt::join(differences, "\n")));
    CHECK(differences.empty());
  }
}

// The step of every full batch after the first is captured and replayed (FitOptions::capture_steps): the same
// kernels in the same order as op by op, each replay with its own learning rate and dropout masks.
TEST_CASE("captured training steps of the flagship equal its op-by-op steps on the device", "[training][capture]") {
  const auto set = data::make_synthetic({.samples = 88, .sample_shape = {32, 32, 3}, .classes = 10, .seed = 7});
  for (const nn::Precision precision : {nn::Precision::Float32, nn::Precision::MixedBFloat16}) {
    INFO(nn::precision_name(precision));
    std::vector<nn::Sequential> models;
    std::vector<train::History> histories;
    std::string said;
    std::vector<std::int64_t> replays;  // "captured step" spans on each run's timeline
    for (const bool capture : {false, true}) {
      const test_util::ScratchDirectory dir("device_capture");
      models.push_back(nn::cifar10_cnn({32, 32, 3}, 11, dut()));
      models.back().set_precision(precision);
      Trainer trainer(models.back(), optim::SGD({.learning_rate = optim::step_decay(0.02, 0.5, 2), .momentum = 0.9}));
      test_util::CapturedOutput log(STDERR_FILENO);
      histories.push_back(trainer.fit(set, {.epochs = 1, .batch_size = 16, .seed = 2,
                                            .verbosity = train::Verbosity::Silent, .timeline = dir.path() / "trace.json",
                                            .capture_steps = capture}));
      said += log.text();
      std::ifstream trace(dir.path() / "trace.json");
      const std::string text{std::istreambuf_iterator<char>(trace), {}};
      std::int64_t spans = 0;
      for (std::size_t at = text.find("\"captured step\""); at != std::string::npos; at = text.find("\"captured step\"", at + 1))
        ++spans;
      replays.push_back(spans);
    }
    CHECK_THAT(said, !Catch::Contains("could not be captured"));
    // 88 samples in batches of 16: the first warms up, the next four are replays, the partial last runs op by op.
    CHECK(replays == std::vector<std::int64_t>{0, 4});
    require_close(histories[0].epochs.back().at("loss"), histories[1].epochs.back().at("loss"), 1e-6, "loss");
    for (const auto& v : models[0].variables()) require_close(v->value, models[1].variable(v->name)->value, 1e-6, v->name);
  }
}

TEST_CASE("a model learns on the device", "[training]") {
  const auto set = data::make_synthetic({.samples = 512, .sample_shape = {8, 8, 3}, .classes = 10, .seed = 3});
  nn::Sequential model = nn::small_cnn({8, 8, 3}, 5, dut());
  Trainer trainer(model, optim::Adam());
  const auto history = trainer.fit(set, {.epochs = 4, .batch_size = 32, .verbosity = train::Verbosity::Silent});
  CHECK(history.epochs.back().at("accuracy") > 0.9);
  CHECK(trainer.evaluate(set).at("accuracy") > 0.9);
}

TEST_CASE("a checkpoint written on the device restores on the CPU and back", "[checkpoint]") {
  test_util::ScratchDirectory dir("device_checkpoint");
  const auto set = data::make_synthetic({.samples = 64, .sample_shape = {8, 8, 3}, .classes = 10, .seed = 3});
  nn::Sequential trained = nn::small_cnn({8, 8, 3}, 5, dut());
  optim::Adam optimizer;
  Trainer(trained, optimizer).fit(set, {.epochs = 1, .batch_size = 16, .verbosity = train::Verbosity::Silent});
  train::save_checkpoint(dir.path() / "device.ckpt", trained, optimizer, {});

  nn::Sequential on_cpu = nn::small_cnn({8, 8, 3}, 99);
  optim::Adam cpu_optimizer;
  train::load_checkpoint(dir.path() / "device.ckpt", on_cpu, cpu_optimizer);
  for (const auto& v : trained.variables()) CHECK(v->value.to_vector() == on_cpu.variable(v->name)->value.to_vector());
  train::save_checkpoint(dir.path() / "cpu.ckpt", on_cpu, cpu_optimizer, {});

  nn::Sequential back = nn::small_cnn({8, 8, 3}, 98, dut());
  optim::Adam device_optimizer;
  train::load_checkpoint(dir.path() / "cpu.ckpt", back, device_optimizer);
  for (const auto& v : trained.variables()) {
    CHECK(back.variable(v->name)->value.device() == dut());
    CHECK(v->value.to_vector() == back.variable(v->name)->value.to_vector());
  }
}

TEST_CASE("asynchronous copies between host and device arrive whole", "[memory]") {
  const Tensor host = test_util::random_tensor({333, 77}, 40);
  const Tensor pinned = Tensor::pinned(host.shape());
  std::copy(host.data(), host.data() + host.numel(), pinned.data());
  Tensor device = Tensor::uninitialized(host.shape(), dut()), back = Tensor::pinned(host.shape());
  CopyStream stream(dut());
  stream.copy(pinned, device);
  stream.synchronize();
  stream.copy(device, back);
  stream.synchronize();
  CHECK(back.to_vector() == host.to_vector());
}

TEST_CASE("a copy to the host lands as its source was when it was queued, once its point is passed; a recorded point "
          "follows every op queued before it", "[memory]") {
  const Tensor host = test_util::random_tensor({333, 77}, 41);
  Tensor doubled = host.clone(), sextupled = host.clone();
  ops::scale(doubled, 2.0f);
  ops::scale(sextupled, 2.0f);
  ops::scale(sextupled, 3.0f);
  const Tensor source = host.to(dut());
  const Tensor landed = Tensor::pinned(host.shape());
  ops::scale(source, 2.0f);  // queued before the copy: in it
  const DeviceEventPtr copied = ops::copy_to_host_async(source, landed);
  ops::scale(source, 3.0f);  // queued after it: not in it
  wait_until_finished(copied, std::chrono::seconds(10), "the copy");
  CHECK(landed.to_vector() == doubled.to_vector());
  const DeviceEventPtr scaled = ops::record_event(dut());
  wait_until_finished(scaled, std::chrono::seconds(10), "the scale");
  CHECK((scaled != nullptr && scaled->cuda_event() != nullptr) == (dut() == Device::CUDA));
  CHECK(source.to(Device::CPU).to_vector() == sextupled.to_vector());
  if (dut() == Device::Emulated) {
    // As on a GPU, a reader that does not await the point may see the old bytes: here it always does.
    const Tensor unread = Tensor::pinned(host.shape());
    ops::fill(unread, -1.0f);
    const DeviceEventPtr pending = ops::copy_to_host_async(source, unread);
    CHECK(unread.to_vector() == std::vector<float>(unread.numel(), -1.0f));
    CHECK(pending->finished());
    CHECK(unread.to_vector() == sextupled.to_vector());
  }
  CHECK_THROWS_WITH(ops::copy_to_host_async(landed, source), Catch::Contains("not the host"));
}

TEST_CASE("running out of device memory is a DeviceError naming the bytes and the allocator", "[memory]") {
  if (dut() != Device::CUDA) SUCCEED("only a real device runs out of memory");
  else {
    const std::int64_t elements = std::int64_t{1} << 40;  // 4 TiB
    try {
      Tensor huge({elements}, dut());
      FAIL("a 4 TiB tensor was allocated");
    } catch (const DeviceError& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find("out of memory allocating 4398046511104 bytes") != std::string::npos);
      CHECK(std::string(e.what()).find("in use") != std::string::npos);
    }
    const Tensor fine({1024}, dut());  // the device still works afterwards
    CHECK(ops::sum(fine) == 0.0);
  }
}
