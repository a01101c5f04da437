// The device-neutral op layer: validates operands, then hands them to the backend of their device.
// This file is the one place where a backend is chosen; a CUDA backend adds its branch in dispatch().
#include "cohort/tensor/ops.hpp"

#include <initializer_list>

#include "cohort/core/check.hpp"
#include "cpu/cpu_ops.hpp"

namespace cohort::ops {
namespace {

// Checks that all defined operands live on one device and returns it.
Device common_device(const char* op, std::initializer_list<const Tensor*> operands) {
  const Tensor* first = nullptr;
  for (const Tensor* t : operands) {
    if (!t->defined()) continue;
    if (first == nullptr) first = t;
    COHORT_CHECK(t->device() == first->device(), "{}: operands on {} and {}", op, device_name(first->device()),
                 device_name(t->device()));
  }
  COHORT_CHECK(first != nullptr, "{}: no defined operand", op);
  return first->device();
}

template <typename CpuKernel>
decltype(auto) dispatch(const char* op, std::initializer_list<const Tensor*> operands, CpuKernel&& cpu_kernel) {
  const Device device = common_device(op, operands);
  if (device == Device::CPU) return cpu_kernel();
  throw DeviceError(fmt::format("{}: no {} kernel in this build", op, device_name(device)));
}

void check_same_shape(const char* op, const Tensor& a, const Tensor& b) {
  COHORT_CHECK(a.shape() == b.shape(), "{}: shapes {} and {} differ", op, a.shape(), b.shape());
}

void check_labels(const char* op, const Tensor& scores, const Tensor& labels) {
  COHORT_CHECK(scores.rank() == 2, "{}: scores must be (N, C), got {}", op, scores.shape());
  const bool sparse = labels.rank() == 1 && labels.dim(0) == scores.dim(0);
  COHORT_CHECK(sparse || labels.shape() == scores.shape(),
               "{}: labels must be (N,) class indices or (N, C) targets matching {}, got {}", op, scores.shape(),
               labels.shape());
}

void check_conv(const Tensor& x, const Tensor& kernel, const Tensor& y, const Conv2dGeometry& g) {
  COHORT_CHECK(x.shape() == Shape({g.batch, g.in_h, g.in_w, g.in_c}), "conv2d: input {} does not match geometry",
               x.shape());
  COHORT_CHECK(kernel.shape() == Shape({g.kernel_h, g.kernel_w, g.in_c, g.out_c}),
               "conv2d: kernel {} does not match geometry", kernel.shape());
  COHORT_CHECK(y.shape() == Shape({g.batch, g.out_h, g.out_w, g.out_c}), "conv2d: output {} does not match geometry",
               y.shape());
  COHORT_CHECK(g.stride_h > 0 && g.stride_w > 0, "conv2d: strides must be positive");
}

void check_pool(const Tensor& x, const Tensor& y, const Pool2dGeometry& g) {
  COHORT_CHECK(x.shape() == Shape({g.batch, g.in_h, g.in_w, g.channels}), "pool2d: input {} does not match geometry",
               x.shape());
  COHORT_CHECK(y.shape() == Shape({g.batch, g.out_h, g.out_w, g.channels}), "pool2d: output {} does not match geometry",
               y.shape());
  COHORT_CHECK(g.stride_h > 0 && g.stride_w > 0 && g.pool_h > 0 && g.pool_w > 0, "pool2d: sizes must be positive");
}

void check_channels(const char* op, const Tensor& x, std::initializer_list<const Tensor*> per_channel) {
  COHORT_CHECK(x.rank() >= 2, "{}: input must have a batch and a channel axis, got {}", op, x.shape());
  for (const Tensor* t : per_channel)
    COHORT_CHECK(t->shape() == Shape({x.dim(x.rank() - 1)}), "{}: per-channel tensor {} for input {}", op, t->shape(),
                 x.shape());
}

}  // namespace

void fill(const Tensor& x, float value) {
  dispatch("fill", {&x}, [&] { cpu::fill(x, value); });
}

void copy(const Tensor& source, const Tensor& destination) {
  COHORT_CHECK(source.numel() == destination.numel(), "copy: {} into {}", source.shape(), destination.shape());
  dispatch("copy", {&source, &destination}, [&] { cpu::copy(source, destination); });
}

void axpy(float alpha, const Tensor& x, const Tensor& y) {
  check_same_shape("axpy", x, y);
  dispatch("axpy", {&x, &y}, [&] { cpu::axpy(alpha, x, y); });
}

void scale(const Tensor& x, float alpha) {
  dispatch("scale", {&x}, [&] { cpu::scale(x, alpha); });
}

void multiply(const Tensor& a, const Tensor& b, const Tensor& out) {
  check_same_shape("multiply", a, b);
  check_same_shape("multiply", a, out);
  dispatch("multiply", {&a, &b, &out}, [&] { cpu::multiply(a, b, out); });
}

double sum(const Tensor& x) {
  return dispatch("sum", {&x}, [&] { return cpu::sum(x); });
}

double sum_of_squares(const Tensor& x) {
  return dispatch("sum_of_squares", {&x}, [&] { return cpu::sum_of_squares(x); });
}

void matmul(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, const Tensor& c, float alpha,
            float beta) {
  COHORT_CHECK(a.rank() == 2 && b.rank() == 2 && c.rank() == 2, "matmul: operands must be matrices, got {} {} {}",
               a.shape(), b.shape(), c.shape());
  const std::int64_t m = transpose_a ? a.dim(1) : a.dim(0);
  const std::int64_t k = transpose_a ? a.dim(0) : a.dim(1);
  const std::int64_t kb = transpose_b ? b.dim(1) : b.dim(0);
  const std::int64_t n = transpose_b ? b.dim(0) : b.dim(1);
  COHORT_CHECK(k == kb && c.dim(0) == m && c.dim(1) == n, "matmul: {}{} x {}{} into {}", a.shape(),
               transpose_a ? "^T" : "", b.shape(), transpose_b ? "^T" : "", c.shape());
  dispatch("matmul", {&a, &b, &c}, [&] {
    cpu::gemm(transpose_a, transpose_b, m, n, k, alpha, a.raw(), a.dim(1), b.raw(), b.dim(1), beta, c.raw(), n);
  });
}

void add_bias(const Tensor& y, const Tensor& bias) {
  check_channels("add_bias", y, {&bias});
  dispatch("add_bias", {&y, &bias}, [&] { cpu::add_bias(y, bias); });
}

void bias_gradient(const Tensor& dy, const Tensor& dbias) {
  check_channels("bias_gradient", dy, {&dbias});
  dispatch("bias_gradient", {&dy, &dbias}, [&] { cpu::bias_gradient(dy, dbias); });
}

void activation_forward(Activation activation, const Tensor& x, const Tensor& y) {
  check_same_shape("activation_forward", x, y);
  dispatch("activation_forward", {&x, &y}, [&] { cpu::activation_forward(activation, x, y); });
}

void activation_backward(Activation activation, const Tensor& y, const Tensor& dy, const Tensor& dx) {
  check_same_shape("activation_backward", y, dy);
  check_same_shape("activation_backward", y, dx);
  dispatch("activation_backward", {&y, &dy, &dx}, [&] { cpu::activation_backward(activation, y, dy, dx); });
}

void conv2d_forward(const Tensor& x, const Tensor& kernel, const Tensor& bias, const Tensor& y,
                    const Conv2dGeometry& geometry) {
  check_conv(x, kernel, y, geometry);
  if (bias.defined()) COHORT_CHECK(bias.shape() == Shape({geometry.out_c}), "conv2d: bias {}", bias.shape());
  dispatch("conv2d_forward", {&x, &kernel, &bias, &y}, [&] { cpu::conv2d_forward(x, kernel, bias, y, geometry); });
}

void conv2d_backward(const Tensor& x, const Tensor& kernel, const Tensor& dy, const Tensor& dx, const Tensor& dkernel,
                     const Tensor& dbias, const Conv2dGeometry& geometry) {
  check_conv(x, kernel, dy, geometry);
  check_same_shape("conv2d_backward", kernel, dkernel);
  if (dx.defined()) check_same_shape("conv2d_backward", x, dx);
  if (dbias.defined()) COHORT_CHECK(dbias.shape() == Shape({geometry.out_c}), "conv2d: dbias {}", dbias.shape());
  dispatch("conv2d_backward", {&x, &kernel, &dy, &dx, &dkernel, &dbias},
           [&] { cpu::conv2d_backward(x, kernel, dy, dx, dkernel, dbias, geometry); });
}

void max_pool_forward(const Tensor& x, const Tensor& y, const Pool2dGeometry& geometry) {
  check_pool(x, y, geometry);
  dispatch("max_pool_forward", {&x, &y}, [&] { cpu::max_pool_forward(x, y, geometry); });
}

void max_pool_backward(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx,
                       const Pool2dGeometry& geometry) {
  check_pool(x, y, geometry);
  check_same_shape("max_pool_backward", y, dy);
  check_same_shape("max_pool_backward", x, dx);
  dispatch("max_pool_backward", {&x, &y, &dy, &dx}, [&] { cpu::max_pool_backward(x, y, dy, dx, geometry); });
}

void avg_pool_forward(const Tensor& x, const Tensor& y, const Pool2dGeometry& geometry) {
  check_pool(x, y, geometry);
  dispatch("avg_pool_forward", {&x, &y}, [&] { cpu::avg_pool_forward(x, y, geometry); });
}

void avg_pool_backward(const Tensor& dy, const Tensor& dx, const Pool2dGeometry& geometry) {
  check_pool(dx, dy, geometry);
  dispatch("avg_pool_backward", {&dy, &dx}, [&] { cpu::avg_pool_backward(dy, dx, geometry); });
}

void batch_norm_forward_training(const Tensor& x, const Tensor& gamma, const Tensor& beta, float epsilon,
                                 const Tensor& y, const Tensor& batch_mean, const Tensor& batch_variance) {
  check_channels("batch_norm", x, {&gamma, &beta, &batch_mean, &batch_variance});
  check_same_shape("batch_norm", x, y);
  COHORT_CHECK(x.numel() > 0, "batch_norm: training needs a non-empty batch, got {}", x.shape());
  dispatch("batch_norm_forward_training", {&x, &gamma, &beta, &y, &batch_mean, &batch_variance},
           [&] { cpu::batch_norm_forward_training(x, gamma, beta, epsilon, y, batch_mean, batch_variance); });
}

void batch_norm_forward_inference(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& mean,
                                  const Tensor& variance, float epsilon, const Tensor& y) {
  check_channels("batch_norm", x, {&gamma, &beta, &mean, &variance});
  check_same_shape("batch_norm", x, y);
  dispatch("batch_norm_forward_inference", {&x, &gamma, &beta, &mean, &variance, &y},
           [&] { cpu::batch_norm_forward_inference(x, gamma, beta, mean, variance, epsilon, y); });
}

void batch_norm_backward(const Tensor& x, const Tensor& gamma, const Tensor& dy, const Tensor& batch_mean,
                         const Tensor& batch_variance, float epsilon, const Tensor& dx, const Tensor& dgamma,
                         const Tensor& dbeta) {
  check_channels("batch_norm_backward", x, {&gamma, &batch_mean, &batch_variance, &dgamma, &dbeta});
  check_same_shape("batch_norm_backward", x, dy);
  if (dx.defined()) check_same_shape("batch_norm_backward", x, dx);
  dispatch("batch_norm_backward", {&x, &gamma, &dy, &batch_mean, &batch_variance, &dx, &dgamma, &dbeta}, [&] {
    cpu::batch_norm_backward(x, gamma, dy, batch_mean, batch_variance, epsilon, dx, dgamma, dbeta);
  });
}

void batch_norm_backward_inference(const Tensor& x, const Tensor& gamma, const Tensor& dy, const Tensor& mean,
                                   const Tensor& variance, float epsilon, const Tensor& dx, const Tensor& dgamma,
                                   const Tensor& dbeta) {
  check_channels("batch_norm_backward_inference", x, {&gamma, &mean, &variance, &dgamma, &dbeta});
  check_same_shape("batch_norm_backward_inference", x, dy);
  if (dx.defined()) check_same_shape("batch_norm_backward_inference", x, dx);
  dispatch("batch_norm_backward_inference", {&x, &gamma, &dy, &mean, &variance, &dx, &dgamma, &dbeta},
           [&] { cpu::batch_norm_backward_inference(x, gamma, dy, mean, variance, epsilon, dx, dgamma, dbeta); });
}

void moving_average_update(const Tensor& moving, const Tensor& batch, float momentum) {
  check_same_shape("moving_average_update", moving, batch);
  dispatch("moving_average_update", {&moving, &batch}, [&] { cpu::moving_average_update(moving, batch, momentum); });
}

void dropout_mask(const Tensor& mask, float rate, std::uint64_t seed) {
  COHORT_CHECK(rate >= 0.0f && rate < 1.0f, "dropout rate must be in [0, 1), got {}", rate);
  dispatch("dropout_mask", {&mask}, [&] { cpu::dropout_mask(mask, rate, seed); });
}

void sgd_update(const Tensor& value, const Tensor& gradient, const Tensor& velocity, float learning_rate,
                float momentum, bool nesterov, float weight_decay) {
  check_same_shape("sgd_update", value, gradient);
  if (velocity.defined()) check_same_shape("sgd_update", value, velocity);
  COHORT_CHECK(momentum == 0.0f || velocity.defined(), "sgd_update: momentum needs a velocity slot");
  dispatch("sgd_update", {&value, &gradient, &velocity},
           [&] { cpu::sgd_update(value, gradient, velocity, learning_rate, momentum, nesterov, weight_decay); });
}

void adam_update(const Tensor& value, const Tensor& gradient, const Tensor& m, const Tensor& v, float learning_rate,
                 float beta_1, float beta_2, float epsilon, float weight_decay) {
  check_same_shape("adam_update", value, gradient);
  check_same_shape("adam_update", value, m);
  check_same_shape("adam_update", value, v);
  dispatch("adam_update", {&value, &gradient, &m, &v},
           [&] { cpu::adam_update(value, gradient, m, v, learning_rate, beta_1, beta_2, epsilon, weight_decay); });
}

void rmsprop_update(const Tensor& value, const Tensor& gradient, const Tensor& mean_square, const Tensor& mean_gradient,
                    const Tensor& velocity, float learning_rate, float rho, float momentum, float epsilon,
                    float weight_decay) {
  check_same_shape("rmsprop_update", value, gradient);
  check_same_shape("rmsprop_update", value, mean_square);
  if (mean_gradient.defined()) check_same_shape("rmsprop_update", value, mean_gradient);
  COHORT_CHECK(momentum == 0.0f || velocity.defined(), "rmsprop_update: momentum needs a velocity slot");
  dispatch("rmsprop_update", {&value, &gradient, &mean_square, &mean_gradient, &velocity}, [&] {
    cpu::rmsprop_update(value, gradient, mean_square, mean_gradient, velocity, learning_rate, rho, momentum, epsilon,
                        weight_decay);
  });
}

double softmax_cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& dlogits) {
  check_labels("softmax_cross_entropy", logits, labels);
  if (dlogits.defined()) check_same_shape("softmax_cross_entropy", logits, dlogits);
  return dispatch("softmax_cross_entropy", {&logits, &labels, &dlogits},
                  [&] { return cpu::softmax_cross_entropy(logits, labels, dlogits); });
}

double categorical_cross_entropy(const Tensor& probabilities, const Tensor& labels, const Tensor& dprobabilities) {
  check_labels("categorical_cross_entropy", probabilities, labels);
  if (dprobabilities.defined()) check_same_shape("categorical_cross_entropy", probabilities, dprobabilities);
  return dispatch("categorical_cross_entropy", {&probabilities, &labels, &dprobabilities},
                  [&] { return cpu::categorical_cross_entropy(probabilities, labels, dprobabilities); });
}

std::int64_t count_correct(const Tensor& scores, const Tensor& labels) {
  check_labels("count_correct", scores, labels);
  return dispatch("count_correct", {&scores, &labels}, [&] { return cpu::count_correct(scores, labels); });
}

}  // namespace cohort::ops
