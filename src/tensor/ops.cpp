// The device-neutral op layer: validates operands once, then hands them to the backend of their device
// (backend_for() in backend.cpp is the one place that maps a device to its backend).
#include "cohort/tensor/ops.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <initializer_list>
#include <optional>
#include <span>

#include "cohort/core/check.hpp"
#include "cohort/tensor/capture.hpp"
#include "tensor/backend.hpp"
#include "tensor/backend_access.hpp"
#include "tensor/float32_stand_ins.hpp"

namespace cohort {

template <class Geometry>
Plan<Geometry>::Plan(const Geometry& geometry, Device device) : geometry_(geometry), device_(device) {
  state_ = backend_for(device).plan(geometry_);
}

template <class Geometry>
void Plan<Geometry>::prepare(Device device) {
  if (state_ != nullptr && device == device_) return;
  state_ = backend_for(device).plan(geometry_);
  device_ = device;
}

template class Plan<Conv2dGeometry>;
template class Plan<Pool2dGeometry>;
template class Plan<BatchNormGeometry>;

namespace ops {
namespace {

std::string describe_operands(std::span<const Tensor* const> operands) {
  std::string out;
  for (const Tensor* t : operands)
    if (t->defined())
      out += fmt::format("{}{} {} on {}", out.empty() ? "" : ", ", dtype_name(t->dtype()), t->shape(),
                         device_name(t->device()));
  return out;
}

// What element types an op takes: float32 and at most one 16-bit type (computed through float32 stand-ins
// where a backend has no kernel for it), float32 only (optimizer updates of the float32 master variables),
// one type shared by all operands (copies), or any (the op checked them itself).
enum class Types { Floating, Float32, Same, Checked };

// Where operand `t` breaks the rule, given the first defined operand and the 16-bit type seen so far.
bool breaks(Types types, const Tensor& t, const Tensor& first, std::optional<DType>& low) {
  switch (types) {
    case Types::Floating:
      if (t.dtype() == DType::Float32) return false;
      if (!is_floating(t.dtype()) || (low && *low != t.dtype())) return true;
      low = t.dtype();
      return false;
    case Types::Float32: return t.dtype() != DType::Float32;
    case Types::Same: return t.dtype() != first.dtype();
    case Types::Checked: break;
  }
  return false;
}

std::string_view rule_name(Types types) {
  return types == Types::Floating ? "float32 and at most one 16-bit type of"
                                  : types == Types::Float32 ? "float32" : "same-typed";
}

// The backend of the device every defined operand lives on. Operands on different devices, or still
// being copied asynchronously, are the caller's error: DeviceError naming the op, devices and shapes.
// Operands of an element type the op does not take are InvalidArgument naming the op, types and shapes.
Backend& backend_of(const char* op, std::span<const Tensor* const> operands, Types types = Types::Floating) {
  const Tensor* first = nullptr;
  std::optional<DType> low;
  for (const Tensor* t : operands) {
    if (!t->defined()) continue;
    if (first == nullptr) first = t;
    if (breaks(types, *t, *first, low)) [[unlikely]]
      throw InvalidArgument(fmt::format("{}: takes {} operands, got {}; convert them with to(DType) first", op,
                                        rule_name(types), describe_operands(operands)));
    if (t->device() != first->device()) [[unlikely]]
      throw DeviceError(fmt::format("{}: operands on different devices ({}); move them with to() first", op,
                                    describe_operands(operands)));
    if (t->copy_in_flight()) [[unlikely]]
      throw DeviceError(fmt::format("{}: an operand of shape {} on {} is still being copied by a CopyStream; call its "
                                    "synchronize() first",
                                    op, t->shape(), device_name(t->device())));
  }
  COHORT_CHECK(first != nullptr, "{}: no defined operand", op);
  keep_while_captured(operands);
  return backend_for(first->device());
}

Backend& backend_of(const char* op, std::initializer_list<const Tensor*> operands, Types types = Types::Floating) {
  return backend_of(op, std::span<const Tensor* const>(operands.begin(), operands.size()), types);
}

// Whether `backend` computes `kernel` itself on these operands: those in `low` of one 16-bit type it has the
// kernel for, those in `wide` float32, those in `either` of either type (undefined ones pass).
bool computes_itself(const Backend& backend, Backend::Kernel16 kernel, std::initializer_list<const Tensor*> low,
                     std::initializer_list<const Tensor*> wide, std::initializer_list<const Tensor*> either = {}) {
  const DType type = (*low.begin())->dtype();
  if (type == DType::Float32 || !backend.computes(kernel, type)) return false;
  const auto all = [](std::initializer_list<const Tensor*> operands, auto&& fits) {
    return std::all_of(operands.begin(), operands.end(), [&](const Tensor* t) { return !t->defined() || fits(t->dtype()); });
  };
  return all(low, [&](DType t) { return t == type; }) && all(wide, [](DType t) { return t == DType::Float32; }) &&
         all(either, [&](DType t) { return t == type || t == DType::Float32; });
}

void check_step_counter(const char* op, const Tensor& step) {
  COHORT_CHECK(step.dtype() == DType::Int32 && step.shape() == Shape{2},
               "{}: a step counter is int32 (2) (ops::step_counter), got {} {}", op, dtype_name(step.dtype()), step.shape());
}

void check_learning_rate(const char* op, const Tensor& learning_rate, Device device) {
  COHORT_CHECK(learning_rate.defined() && learning_rate.dtype() == DType::Float32 && learning_rate.numel() == 1,
               "{}: the learning rate is a float32 scalar (ops::scalar), got {}", op,
               learning_rate.defined() ? fmt::format("{} {}", dtype_name(learning_rate.dtype()), learning_rate.shape())
                                       : std::string("an undefined tensor"));
  if (learning_rate.device() != device)
    throw DeviceError(fmt::format("{}: the variables are on {}, the learning rate on {}", op, device_name(device),
                                  device_name(learning_rate.device())));
}

void check_same_shape(const char* op, const Tensor& a, const Tensor& b) {
  COHORT_CHECK(a.shape() == b.shape(), "{}: shapes {} and {} differ", op, a.shape(), b.shape());
}

// The labels as the kernels read them: float32, class indices converted from int32.
Tensor checked_labels(const char* op, const Tensor& scores, const Tensor& labels) {
  COHORT_CHECK(scores.rank() == 2, "{}: scores must be (N, C), got {}", op, scores.shape());
  const bool sparse = labels.rank() == 1 && labels.dim(0) == scores.dim(0);
  COHORT_CHECK(sparse || labels.shape() == scores.shape(),
               "{}: labels must be (N,) class indices or (N, C) targets matching {}, got {}", op, scores.shape(),
               labels.shape());
  COHORT_CHECK(labels.dtype() == DType::Float32 || (sparse && labels.dtype() == DType::Int32),
               "{}: labels must be float32, or int32 class indices, got {} {}", op, dtype_name(labels.dtype()),
               labels.shape());
  return labels.to(DType::Float32);
}

void check_sums_device(const char* op, const Tensor& scores, const RunningSums& sums) {
  if (sums.device() != scores.device()) [[unlikely]]
    throw DeviceError(fmt::format("{}: scores {} on {}, the running sums on {}; make the sums on the scores' device", op,
                                  scores.shape(), device_name(scores.device()), device_name(sums.device())));
  keep_while_captured(detail::BackendAccess::storage(sums));
}

double mean_over_rows(const RunningSums& sums, const Tensor& scores) {
  return scores.dim(0) == 0 ? 0.0 : sums.read()[0] / static_cast<double>(scores.dim(0));
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

// check_channels, and the plan made for x's channel count.
void check_batch_norm(const char* op, const BatchNormPlan& plan, const Tensor& x,
                      std::initializer_list<const Tensor*> per_channel) {
  check_channels(op, x, per_channel);
  COHORT_CHECK(plan.geometry().channels == x.dim(x.rank() - 1), "{}: a plan for {} channels got input {}", op,
               plan.geometry().channels, x.shape());
}

}  // namespace

void synchronize(Device device) { backend_for(device).synchronize(); }

DeviceEventPtr record_event(Device device) { return backend_for(device).record_event(); }

DeviceEventPtr copy_to_host_async(const Tensor& source, const Tensor& destination) {
  COHORT_CHECK(source.numel() == destination.numel(), "copy_to_host_async: {} into {}", source.shape(), destination.shape());
  COHORT_CHECK(destination.device() == Device::CPU, "copy_to_host_async: the destination of shape {} is on {}, not the host",
               destination.shape(), device_name(destination.device()));
  const std::array both{&source, &destination};
  COHORT_CHECK(source.dtype() == destination.dtype(), "copy_to_host_async: takes same-typed operands, got {}",
               describe_operands(both));
  if (source.device() == Device::CPU) {
    copy(source, destination);
    return nullptr;
  }
  backend_of("copy_to_host_async", {&source}, Types::Same);
  return backend_for(source.device()).copy_to_host_async(source, destination);
}

void fill(const Tensor& x, float value) {
  Backend& backend = backend_of("fill", {&x});
  const Float32StandIns f({}, {&x});
  backend.fill(f(x), value);
  f.write_back();
}

void copy(const Tensor& source, const Tensor& destination) {
  COHORT_CHECK(source.numel() == destination.numel(), "copy: {} into {}", source.shape(), destination.shape());
  const std::array both{&source, &destination};
  if (source.device() == destination.device()) {
    backend_of("copy", both, Types::Same).copy(source, destination);
    return;
  }
  COHORT_CHECK(source.dtype() == destination.dtype(), "copy: takes same-typed operands, got {}; convert with to(DType)",
               describe_operands(both));
  // Between devices: through the host, which every backend reaches.
  backend_of("copy", {&source}, Types::Same);
  backend_of("copy", {&destination}, Types::Same);
  if (destination.device() == Device::CPU) {
    backend_for(source.device()).copy_to_host(source, destination.host_bytes().data());
  } else if (source.device() == Device::CPU) {
    backend_for(destination.device()).copy_from_host(source.host_bytes().data(), destination);
  } else {
    const Tensor staging = Tensor::uninitialized(source.shape(), source.dtype(), Device::CPU);
    backend_for(source.device()).copy_to_host(source, staging.host_bytes().data());
    backend_for(destination.device()).copy_from_host(staging.host_bytes().data(), destination);
  }
}

void convert(const Tensor& source, const Tensor& destination) {
  const std::array both{&source, &destination};
  COHORT_CHECK(source.shape() == destination.shape(), "convert: shapes differ ({})", describe_operands(both));
  const bool floating = is_floating(source.dtype()) && is_floating(destination.dtype());
  const bool labels = source.dtype() == DType::Int32 && destination.dtype() == DType::Float32;
  COHORT_CHECK(floating || labels, "convert: converts between floating types and from int32 to float32, got {}",
               describe_operands(both));
  Backend& backend = backend_of("convert", both, Types::Checked);
  if (source.numel() == 0) return;
  if (source.dtype() == destination.dtype()) return backend.copy(source, destination);
  if (source.dtype() != DType::Float32 && destination.dtype() != DType::Float32) {
    // Between the two 16-bit types: through float32, which holds both exactly.
    const Tensor wide = Tensor::uninitialized(source.shape(), DType::Float32, source.device());
    backend.convert(source, wide);
    return backend.convert(wide, destination);
  }
  backend.convert(source, destination);
}

void axpy(float alpha, const Tensor& x, const Tensor& y) {
  check_same_shape("axpy", x, y);
  Backend& backend = backend_of("axpy", {&x, &y});
  const Float32StandIns f({&x, &y}, {&y});
  backend.axpy(alpha, f(x), f(y));
  f.write_back();
}

void scale(const Tensor& x, float alpha) {
  Backend& backend = backend_of("scale", {&x});
  const Float32StandIns f({&x}, {&x});
  backend.scale(f(x), alpha);
  f.write_back();
}

void multiply(const Tensor& a, const Tensor& b, const Tensor& out) {
  check_same_shape("multiply", a, b);
  check_same_shape("multiply", a, out);
  Backend& backend = backend_of("multiply", {&a, &b, &out});
  if (computes_itself(backend, Backend::Kernel16::Elementwise, {&a, &b, &out}, {})) return backend.multiply(a, b, out);
  const Float32StandIns f({&a, &b}, {&out});
  backend.multiply(f(a), f(b), f(out));
  f.write_back();
}

double sum(const Tensor& x) {
  Backend& backend = backend_of("sum", {&x});
  return backend.sum(Float32StandIns({&x}, {})(x));
}

double sum_of_squares(const Tensor& x) {
  Backend& backend = backend_of("sum_of_squares", {&x});
  return backend.sum_of_squares(Float32StandIns({&x}, {})(x));
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
  Backend& backend = backend_of("matmul", {&a, &b, &c});
  if (computes_itself(backend, Backend::Kernel16::Matmul, {&a, &b}, {}, {&c}))
    return backend.matmul(a, transpose_a, b, transpose_b, c, alpha, beta);
  const Float32StandIns f = beta == 0.0f ? Float32StandIns({&a, &b}, {&c}) : Float32StandIns({&a, &b, &c}, {&c});
  backend.matmul(f(a), transpose_a, f(b), transpose_b, f(c), alpha, beta);
  f.write_back();
}

void add_bias(const Tensor& y, const Tensor& bias) {
  check_channels("add_bias", y, {&bias});
  Backend& backend = backend_of("add_bias", {&y, &bias});
  const Float32StandIns f({&y, &bias}, {&y});
  backend.add_bias(f(y), f(bias));
  f.write_back();
}

void bias_gradient(const Tensor& dy, const Tensor& dbias) {
  check_channels("bias_gradient", dy, {&dbias});
  Backend& backend = backend_of("bias_gradient", {&dy, &dbias});
  const Float32StandIns f({&dy}, {&dbias});
  backend.bias_gradient(f(dy), f(dbias));
  f.write_back();
}

void activation_forward(Activation activation, const Tensor& x, const Tensor& y) {
  check_same_shape("activation_forward", x, y);
  Backend& backend = backend_of("activation_forward", {&x, &y});
  if (activation != Activation::Softmax && computes_itself(backend, Backend::Kernel16::Elementwise, {&x, &y}, {}))
    return backend.activation_forward(activation, x, y);
  const Float32StandIns f({&x}, {&y});
  backend.activation_forward(activation, f(x), f(y));
  f.write_back();
}

void activation_backward(Activation activation, const Tensor& y, const Tensor& dy, const Tensor& dx) {
  check_same_shape("activation_backward", y, dy);
  check_same_shape("activation_backward", y, dx);
  Backend& backend = backend_of("activation_backward", {&y, &dy, &dx});
  if (activation != Activation::Softmax && computes_itself(backend, Backend::Kernel16::Elementwise, {&y, &dy, &dx}, {}))
    return backend.activation_backward(activation, y, dy, dx);
  const Float32StandIns f({&y, &dy}, {&dx});
  backend.activation_backward(activation, f(y), f(dy), f(dx));
  f.write_back();
}

void conv2d_forward(Conv2dPlan& plan, const Tensor& x, const Tensor& kernel, const Tensor& bias, const Tensor& y) {
  conv2d_activation_forward(plan, x, kernel, bias, Activation::Linear, y);
}

void conv2d_backward(Conv2dPlan& plan, const Tensor& x, const Tensor& kernel, const Tensor& dy, const Tensor& dx,
                     const Tensor& dkernel, const Tensor& dbias) {
  Backend& backend = backend_of("conv2d_backward", {&x, &kernel, &dy, &dx, &dkernel, &dbias});
  Conv2dGeometry g = plan.geometry();
  g.batch = x.rank() > 0 ? x.dim(0) : 0;
  check_conv(x, kernel, dy, g);
  check_same_shape("conv2d_backward", kernel, dkernel);
  if (dx.defined()) check_same_shape("conv2d_backward", x, dx);
  if (dbias.defined()) COHORT_CHECK(dbias.shape() == Shape({g.out_c}), "conv2d: dbias {}", dbias.shape());
  plan.prepare(x.device());
  if (computes_itself(backend, Backend::Kernel16::Conv2d, {&x, &kernel, &dy, &dx}, {&dkernel, &dbias}))
    return backend.conv2d_backward(plan.state(), g, x, kernel, dy, dx, dkernel, dbias);
  const Float32StandIns f({&x, &kernel, &dy}, {&dx, &dkernel, &dbias});
  backend.conv2d_backward(plan.state(), g, f(x), f(kernel), f(dy), f(dx), f(dkernel), f(dbias));
  f.write_back();
}

void pool2d_forward(Pool2dPlan& plan, const Tensor& x, const Tensor& y) {
  Backend& backend = backend_of("pool2d_forward", {&x, &y});
  Pool2dGeometry g = plan.geometry();
  g.batch = x.rank() > 0 ? x.dim(0) : 0;
  check_pool(x, y, g);
  plan.prepare(x.device());
  if (g.mode == PoolMode::Max && computes_itself(backend, Backend::Kernel16::MaxPooling, {&x, &y}, {}))
    return backend.pool2d_forward(plan.state(), g, x, y);
  const Float32StandIns f({&x}, {&y});
  backend.pool2d_forward(plan.state(), g, f(x), f(y));
  f.write_back();
}

void pool2d_backward(Pool2dPlan& plan, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx) {
  Backend& backend = backend_of("pool2d_backward", {&x, &y, &dy, &dx});
  Pool2dGeometry g = plan.geometry();
  g.batch = x.rank() > 0 ? x.dim(0) : 0;
  check_pool(x, y, g);
  check_same_shape("pool2d_backward", y, dy);
  check_same_shape("pool2d_backward", x, dx);
  plan.prepare(x.device());
  if (g.mode == PoolMode::Max && computes_itself(backend, Backend::Kernel16::MaxPooling, {&x, &y, &dy, &dx}, {}))
    return backend.pool2d_backward(plan.state(), g, x, y, dy, dx);
  const Float32StandIns f({&x, &y, &dy}, {&dx});
  backend.pool2d_backward(plan.state(), g, f(x), f(y), f(dy), f(dx));
  f.write_back();
}

void batch_norm_forward_training(BatchNormPlan& plan, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                 const Tensor& y, const Tensor& batch_mean, const Tensor& batch_variance) {
  batch_norm_activation_forward_training(plan, x, gamma, beta, Activation::Linear, y, batch_mean, batch_variance);
}

void batch_norm_forward_inference(BatchNormPlan& plan, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                  const Tensor& mean, const Tensor& variance, const Tensor& y) {
  batch_norm_activation_forward_inference(plan, x, gamma, beta, mean, variance, Activation::Linear, y);
}

void batch_norm_backward(BatchNormPlan& plan, const Tensor& x, const Tensor& gamma, const Tensor& dy,
                         const Tensor& batch_mean, const Tensor& batch_variance, const Tensor& dx, const Tensor& dgamma,
                         const Tensor& dbeta) {
  Backend& backend =
      backend_of("batch_norm_backward", {&x, &gamma, &dy, &batch_mean, &batch_variance, &dx, &dgamma, &dbeta});
  check_batch_norm("batch_norm_backward", plan, x, {&gamma, &batch_mean, &batch_variance, &dgamma, &dbeta});
  check_same_shape("batch_norm_backward", x, dy);
  if (dx.defined()) check_same_shape("batch_norm_backward", x, dx);
  plan.prepare(x.device());
  if (computes_itself(backend, Backend::Kernel16::BatchNorm, {&x, &dy, &dx}, {&gamma, &batch_mean, &batch_variance, &dgamma, &dbeta}))
    return backend.batch_norm_backward(plan.state(), plan.geometry(), x, gamma, dy, batch_mean, batch_variance, dx, dgamma,
                                       dbeta);
  const Float32StandIns f({&x, &gamma, &dy, &batch_mean, &batch_variance}, {&dx, &dgamma, &dbeta});
  backend.batch_norm_backward(plan.state(), plan.geometry(), f(x), f(gamma), f(dy), f(batch_mean), f(batch_variance),
                              f(dx), f(dgamma), f(dbeta));
  f.write_back();
}

void batch_norm_backward_inference(BatchNormPlan& plan, const Tensor& x, const Tensor& gamma, const Tensor& dy,
                                   const Tensor& mean, const Tensor& variance, const Tensor& dx, const Tensor& dgamma,
                                   const Tensor& dbeta) {
  Backend& backend =
      backend_of("batch_norm_backward_inference", {&x, &gamma, &dy, &mean, &variance, &dx, &dgamma, &dbeta});
  check_batch_norm("batch_norm_backward_inference", plan, x, {&gamma, &mean, &variance, &dgamma, &dbeta});
  check_same_shape("batch_norm_backward_inference", x, dy);
  if (dx.defined()) check_same_shape("batch_norm_backward_inference", x, dx);
  plan.prepare(x.device());
  if (computes_itself(backend, Backend::Kernel16::BatchNorm, {&x, &dy, &dx}, {&gamma, &mean, &variance, &dgamma, &dbeta}))
    return backend.batch_norm_backward_inference(plan.state(), plan.geometry(), x, gamma, dy, mean, variance, dx, dgamma,
                                                 dbeta);
  const Float32StandIns f({&x, &gamma, &dy, &mean, &variance}, {&dx, &dgamma, &dbeta});
  backend.batch_norm_backward_inference(plan.state(), plan.geometry(), f(x), f(gamma), f(dy), f(mean), f(variance),
                                        f(dx), f(dgamma), f(dbeta));
  f.write_back();
}

void moving_average_update(const Tensor& moving, const Tensor& batch, float momentum) {
  check_same_shape("moving_average_update", moving, batch);
  Backend& backend = backend_of("moving_average_update", {&moving, &batch});
  const Float32StandIns f({&moving, &batch}, {&moving});
  backend.moving_average_update(f(moving), f(batch), momentum);
  f.write_back();
}

void dropout_mask(const Tensor& mask, float rate, std::uint64_t seed) { dropout_mask(mask, rate, seed, Tensor()); }

void dropout_mask(const Tensor& mask, float rate, std::uint64_t seed, const Tensor& step) {
  COHORT_CHECK(rate >= 0.0f && rate < 1.0f, "dropout rate must be in [0, 1), got {}", rate);
  Backend& backend = backend_of("dropout_mask", {&mask});
  if (step.defined()) {
    check_step_counter("dropout_mask", step);
    keep_while_captured(step);
    if (step.device() != mask.device())
      throw DeviceError(fmt::format("dropout_mask: the mask is on {}, the step counter on {}", device_name(mask.device()),
                                    device_name(step.device())));
  }
  if (computes_itself(backend, Backend::Kernel16::Elementwise, {&mask}, {}))
    return backend.dropout_mask(mask, rate, seed, step);
  const Float32StandIns f({}, {&mask});
  backend.dropout_mask(f(mask), rate, seed, step);
  f.write_back();
}

namespace {

// A step value made inside a capture would get its first value from a recorded op, which every replay would
// run again after writing the step's own value.
void refuse_step_value_in_capture(const char* op, Device device) {
  if (capturing(device))
    throw DeviceError(fmt::format("{} while work is captured on {}: make the tensor before the capture", op,
                                  device_name(device)));
}

}  // namespace

Tensor step_counter(Device device) {
  refuse_step_value_in_capture("ops::step_counter", device);
  return Tensor(Shape{2}, DType::Int32, device);
}

Tensor scalar(float value, Device device) {
  refuse_step_value_in_capture("ops::scalar", device);
  Tensor scalar = Tensor::uninitialized(Shape{}, device);
  backend_for(device).write_bits(scalar, std::bit_cast<std::uint32_t>(value));
  return scalar;
}

void expand_images(const Tensor& images, const Tensor& indices, const Tensor& draws, const Tensor& mean,
                   const Tensor& stddev, const Tensor& out) {
  const std::array operands{&images, &indices, &draws, &mean, &stddev, &out};
  Backend& backend = backend_of("expand_images", operands, Types::Checked);
  const bool types = images.dtype() == DType::UInt8 && (!indices.defined() || indices.dtype() == DType::Int32) &&
                     draws.dtype() == DType::Int32 && mean.dtype() == DType::Float32 &&
                     stddev.dtype() == DType::Float32 && out.dtype() == DType::Float32;
  COHORT_CHECK(types, "expand_images: takes uint8 images, int32 indices and draws, float32 mean, stddev and output, "
               "got {}", describe_operands(operands));
  const std::int64_t samples = out.rank() == 4 ? out.dim(0) : -1;
  const bool shapes = images.rank() == 4 && out.rank() == 4 && out.shape().sample() == images.shape().sample() &&
                      (indices.defined() ? indices.shape() == Shape({samples}) : images.dim(0) == samples) &&
                      draws.shape() == Shape({samples, 3}) && mean.shape() == Shape({images.dim(3)}) &&
                      stddev.shape() == mean.shape();
  COHORT_CHECK(shapes, "expand_images: takes images (S, H, W, C), indices (N) or none (S = N), draws (N, 3), mean and "
               "stddev (C) and an output (N, H, W, C), got {}", describe_operands(operands));
  if (indices.defined() && indices.device() == Device::CPU) {
    const std::int32_t* index = indices.data<std::int32_t>();
    for (std::int64_t n = 0; n < samples; ++n)
      COHORT_CHECK(index[n] >= 0 && index[n] < images.dim(0), "expand_images: index {} of sample {} is outside the {} "
                   "images", index[n], n, images.dim(0));
  }
  if (out.numel() > 0) backend.expand_images(images, indices, draws, mean, stddev, out);
}

namespace {

void check_elementwise(const char* op, Activation activation) {
  COHORT_CHECK(activation != Activation::Softmax, "{}: fuses elementwise activations only, got Softmax", op);
}

}  // namespace

void conv2d_activation_forward(Conv2dPlan& plan, const Tensor& x, const Tensor& kernel, const Tensor& bias,
                               Activation activation, const Tensor& y) {
  check_elementwise("conv2d_forward", activation);
  Backend& backend = backend_of("conv2d_forward", {&x, &kernel, &bias, &y});
  Conv2dGeometry g = plan.geometry();
  g.batch = x.rank() > 0 ? x.dim(0) : 0;
  check_conv(x, kernel, y, g);
  if (bias.defined()) COHORT_CHECK(bias.shape() == Shape({g.out_c}), "conv2d: bias {}", bias.shape());
  plan.prepare(x.device());
  if (computes_itself(backend, Backend::Kernel16::Conv2d, {&x, &kernel, &y}, {}, {&bias}))
    return backend.conv2d_forward_activated(plan.state(), g, x, kernel, bias, activation, y);
  const Float32StandIns f({&x, &kernel, &bias}, {&y});
  backend.conv2d_forward_activated(plan.state(), g, f(x), f(kernel), f(bias), activation, f(y));
  f.write_back();
}

void bias_activation_forward(const Tensor& y, const Tensor& bias, Activation activation) {
  check_elementwise("bias_activation_forward", activation);
  check_channels("bias_activation_forward", y, {&bias});
  Backend& backend = backend_of("bias_activation_forward", {&y, &bias});
  const Float32StandIns f({&y, &bias}, {&y});
  backend.bias_activation_forward(f(y), f(bias), activation);
  f.write_back();
}

void activation_bias_backward(Activation activation, const Tensor& y, const Tensor& dy, const Tensor& dpre,
                              const Tensor& dbias) {
  check_elementwise("activation_bias_backward", activation);
  check_same_shape("activation_bias_backward", y, dy);
  check_same_shape("activation_bias_backward", y, dpre);
  check_channels("activation_bias_backward", y, {&dbias});
  Backend& backend = backend_of("activation_bias_backward", {&y, &dy, &dpre, &dbias});
  const Float32StandIns f({&y, &dy}, {&dpre, &dbias});
  backend.activation_bias_backward(activation, f(y), f(dy), f(dpre), f(dbias));
  f.write_back();
}

void batch_norm_activation_forward_training(BatchNormPlan& plan, const Tensor& x, const Tensor& gamma,
                                            const Tensor& beta, Activation activation, const Tensor& y,
                                            const Tensor& batch_mean, const Tensor& batch_variance) {
  check_elementwise("batch_norm_forward_training", activation);
  Backend& backend = backend_of("batch_norm_forward_training", {&x, &gamma, &beta, &y, &batch_mean, &batch_variance});
  check_batch_norm("batch_norm", plan, x, {&gamma, &beta, &batch_mean, &batch_variance});
  check_same_shape("batch_norm", x, y);
  COHORT_CHECK(x.numel() > 0, "batch_norm: training needs a non-empty batch, got {}", x.shape());
  plan.prepare(x.device());
  if (computes_itself(backend, Backend::Kernel16::BatchNorm, {&x, &y}, {&gamma, &beta, &batch_mean, &batch_variance}))
    return backend.batch_norm_activation_forward_training(plan.state(), plan.geometry(), x, gamma, beta, activation, y,
                                                          batch_mean, batch_variance);
  const Float32StandIns f({&x, &gamma, &beta}, {&y, &batch_mean, &batch_variance});
  backend.batch_norm_activation_forward_training(plan.state(), plan.geometry(), f(x), f(gamma), f(beta), activation,
                                                 f(y), f(batch_mean), f(batch_variance));
  f.write_back();
}

void batch_norm_activation_forward_inference(BatchNormPlan& plan, const Tensor& x, const Tensor& gamma,
                                             const Tensor& beta, const Tensor& mean, const Tensor& variance,
                                             Activation activation, const Tensor& y) {
  check_elementwise("batch_norm_forward_inference", activation);
  Backend& backend = backend_of("batch_norm_forward_inference", {&x, &gamma, &beta, &mean, &variance, &y});
  check_batch_norm("batch_norm", plan, x, {&gamma, &beta, &mean, &variance});
  check_same_shape("batch_norm", x, y);
  plan.prepare(x.device());
  if (computes_itself(backend, Backend::Kernel16::BatchNorm, {&x, &y}, {&gamma, &beta, &mean, &variance}))
    return backend.batch_norm_activation_forward_inference(plan.state(), plan.geometry(), x, gamma, beta, mean, variance,
                                                           activation, y);
  const Float32StandIns f({&x, &gamma, &beta, &mean, &variance}, {&y});
  backend.batch_norm_activation_forward_inference(plan.state(), plan.geometry(), f(x), f(gamma), f(beta), f(mean),
                                                  f(variance), activation, f(y));
  f.write_back();
}

void batch_norm_activation_backward(BatchNormPlan& plan, const Tensor& x, const Tensor& y, const Tensor& gamma,
                                    const Tensor& beta, const Tensor& dy, const Tensor& batch_mean, const Tensor& batch_variance,
                                    Activation activation, const Tensor& dx, const Tensor& dgamma,
                                    const Tensor& dbeta) {
  check_elementwise("batch_norm_activation_backward", activation);
  Backend& backend = backend_of("batch_norm_activation_backward",
                                {&x, &y, &gamma, &beta, &dy, &batch_mean, &batch_variance, &dx, &dgamma, &dbeta});
  check_batch_norm("batch_norm_backward", plan, x, {&gamma, &beta, &batch_mean, &batch_variance, &dgamma, &dbeta});
  check_same_shape("batch_norm_backward", x, y);
  check_same_shape("batch_norm_backward", x, dy);
  if (dx.defined()) check_same_shape("batch_norm_backward", x, dx);
  plan.prepare(x.device());
  if (computes_itself(backend, Backend::Kernel16::BatchNorm, {&x, &y, &dy, &dx},
                      {&gamma, &beta, &batch_mean, &batch_variance, &dgamma, &dbeta}))
    return backend.batch_norm_activation_backward(plan.state(), plan.geometry(), x, y, gamma, beta, dy, batch_mean,
                                                  batch_variance, activation, dx, dgamma, dbeta);
  const Float32StandIns f({&x, &y, &gamma, &beta, &dy, &batch_mean, &batch_variance}, {&dx, &dgamma, &dbeta});
  backend.batch_norm_activation_backward(plan.state(), plan.geometry(), f(x), f(y), f(gamma), f(beta), f(dy),
                                         f(batch_mean), f(batch_variance), activation, f(dx), f(dgamma), f(dbeta));
  f.write_back();
}

namespace {

// The backend of every operand of every variable, each variable's operands shaped like its value, and of the
// learning rate.
template <class Operands, class Each>
Backend& update_backend(const char* op, const std::vector<Operands>& variables, const Tensor& learning_rate,
                        Each&& operands_of) {
  COHORT_CHECK(!variables.empty(), "{}: no variables", op);
  Backend* backend = nullptr;
  for (const Operands& variable : variables) {
    const auto operands = operands_of(variable);
    for (const Tensor* t : operands)
      if (t->defined()) check_same_shape(op, variable.value, *t);
    Backend& mine = backend_of(op, operands, Types::Float32);
    if (backend != nullptr && &mine != backend)
      throw DeviceError(fmt::format("{}: variables on {} and on {} in one update", op, device_name(backend->device()),
                                    device_name(mine.device())));
    backend = &mine;
  }
  check_learning_rate(op, learning_rate, backend->device());
  keep_while_captured(learning_rate);
  return *backend;
}

}  // namespace

void sgd_update(const std::vector<SgdOperands>& variables, const Tensor& learning_rate, float momentum, bool nesterov,
                float weight_decay) {
  for (const SgdOperands& v : variables)
    COHORT_CHECK(momentum == 0.0f || v.velocity.defined(), "sgd_update: momentum needs a velocity slot");
  update_backend("sgd_update", variables, learning_rate, [](const SgdOperands& v) {
    return std::array<const Tensor*, 3>{&v.value, &v.gradient, &v.velocity};
  }).sgd_update(variables, learning_rate, momentum, nesterov, weight_decay);
}

void adam_update(const std::vector<AdamOperands>& variables, const Tensor& learning_rate, float beta_1, float beta_2,
                 float epsilon, float weight_decay) {
  for (const AdamOperands& v : variables)
    COHORT_CHECK(v.m.defined() && v.v.defined(), "adam_update: both moments are needed");
  update_backend("adam_update", variables, learning_rate, [](const AdamOperands& v) {
    return std::array<const Tensor*, 4>{&v.value, &v.gradient, &v.m, &v.v};
  }).adam_update(variables, learning_rate, beta_1, beta_2, epsilon, weight_decay);
}

void rmsprop_update(const std::vector<RmspropOperands>& variables, const Tensor& learning_rate, float rho, float momentum,
                    float epsilon, float weight_decay) {
  for (const RmspropOperands& v : variables) {
    COHORT_CHECK(v.mean_square.defined(), "rmsprop_update: the mean_square slot is needed");
    COHORT_CHECK(momentum == 0.0f || v.velocity.defined(), "rmsprop_update: momentum needs a velocity slot");
  }
  update_backend("rmsprop_update", variables, learning_rate, [](const RmspropOperands& v) {
    return std::array<const Tensor*, 5>{&v.value, &v.gradient, &v.mean_square, &v.mean_gradient, &v.velocity};
  }).rmsprop_update(variables, learning_rate, rho, momentum, epsilon, weight_decay);
}

void softmax_cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& dlogits, const RunningSums& sums,
                           int slot) {
  const Tensor float_labels = checked_labels("softmax_cross_entropy", logits, labels);
  if (dlogits.defined()) check_same_shape("softmax_cross_entropy", logits, dlogits);
  Backend& backend = backend_of("softmax_cross_entropy", {&logits, &float_labels, &dlogits});
  check_sums_device("softmax_cross_entropy", logits, sums);
  const Float32StandIns f({&logits}, {&dlogits});
  backend.softmax_cross_entropy(f(logits), float_labels, f(dlogits), sums, slot);
  f.write_back();
}

void categorical_cross_entropy(const Tensor& probabilities, const Tensor& labels, const Tensor& dprobabilities,
                               const RunningSums& sums, int slot) {
  const Tensor float_labels = checked_labels("categorical_cross_entropy", probabilities, labels);
  if (dprobabilities.defined()) check_same_shape("categorical_cross_entropy", probabilities, dprobabilities);
  Backend& backend = backend_of("categorical_cross_entropy", {&probabilities, &float_labels, &dprobabilities});
  check_sums_device("categorical_cross_entropy", probabilities, sums);
  const Float32StandIns f({&probabilities}, {&dprobabilities});
  backend.categorical_cross_entropy(f(probabilities), float_labels, f(dprobabilities), sums, slot);
  f.write_back();
}

void count_correct(const Tensor& scores, const Tensor& labels, const RunningSums& sums, int slot) {
  const Tensor float_labels = checked_labels("count_correct", scores, labels);
  Backend& backend = backend_of("count_correct", {&scores, &float_labels});
  check_sums_device("count_correct", scores, sums);
  backend.count_correct(Float32StandIns({&scores}, {})(scores), float_labels, sums, slot);
}

void count_top_k(const Tensor& scores, const Tensor& labels, int k, const RunningSums& sums, int slot) {
  COHORT_CHECK(k >= 1, "count_top_k: k must be at least 1, got {}", k);
  const Tensor float_labels = checked_labels("count_top_k", scores, labels);
  Backend& backend = backend_of("count_top_k", {&scores, &float_labels});
  check_sums_device("count_top_k", scores, sums);
  backend.count_top_k(Float32StandIns({&scores}, {})(scores), float_labels, k, sums, slot);
}

void elementwise_loss(ElementwiseLoss loss, const Tensor& prediction, const Tensor& targets, const Tensor& gradient,
                      const RunningSums& sums, int slot) {
  COHORT_CHECK(prediction.rank() >= 1 && targets.rank() >= 1 && targets.dim(0) == prediction.dim(0) &&
                   targets.numel() == prediction.numel(),
               "elementwise_loss: needs targets shaped like the prediction {}, got {}", prediction.shape(),
               targets.shape());
  COHORT_CHECK(targets.dtype() == DType::Float32 || targets.dtype() == DType::Int32,
               "elementwise_loss: targets must be float32, or int32 classes, got {} {}", dtype_name(targets.dtype()),
               targets.shape());
  if (gradient.defined()) check_same_shape("elementwise_loss", prediction, gradient);
  if (prediction.numel() == 0) return;  // rows of no outputs add nothing, as no rows do
  const Tensor float_targets = targets.to(DType::Float32);
  Backend& backend = backend_of("elementwise_loss", {&prediction, &float_targets, &gradient});
  check_sums_device("elementwise_loss", prediction, sums);
  const Float32StandIns f({&prediction}, {&gradient});
  backend.elementwise_loss(loss, f(prediction), float_targets, f(gradient), sums, slot);
  f.write_back();
}

double elementwise_loss(ElementwiseLoss loss, const Tensor& prediction, const Tensor& targets, const Tensor& gradient) {
  const RunningSums sums(prediction.device(), 1);
  elementwise_loss(loss, prediction, targets, gradient, sums, 0);
  return mean_over_rows(sums, prediction);
}

double softmax_cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& dlogits) {
  const RunningSums sums(logits.device(), 1);
  softmax_cross_entropy(logits, labels, dlogits, sums, 0);
  return mean_over_rows(sums, logits);
}

double categorical_cross_entropy(const Tensor& probabilities, const Tensor& labels, const Tensor& dprobabilities) {
  const RunningSums sums(probabilities.device(), 1);
  categorical_cross_entropy(probabilities, labels, dprobabilities, sums, 0);
  return mean_over_rows(sums, probabilities);
}

std::int64_t count_correct(const Tensor& scores, const Tensor& labels) {
  const RunningSums sums(scores.device(), 1);
  count_correct(scores, labels, sums, 0);
  return static_cast<std::int64_t>(sums.read()[0]);
}

}  // namespace ops
}  // namespace cohort
