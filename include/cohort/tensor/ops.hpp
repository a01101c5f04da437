#pragma once
// Device-neutral tensor operations: the only compute entry points that layer, loss and optimizer code
// call. Each checks shapes and devices once, then calls the backend of its operands' device
// (src/tensor/backend.hpp lists what a backend implements; src/tensor/backend.cpp picks it). Operands on
// different devices, or in the middle of an asynchronous copy, are a DeviceError naming the op, the
// devices and the shapes. Ops compute in float32: operands of another element type are InvalidArgument
// naming the op, the types and the shapes (convert() changes a tensor's type); labels may be int32, images
// uint8 for expand_images(). Images are NHWC, convolution kernels HWIO (Keras layout), matrices row-major.
// Outputs must be allocated by the caller with the right shape.
//
// Convolution, pooling and batch normalization take a plan: made once per layer at build time, it is
// where a backend keeps what it prepares for a shape (descriptors, the algorithm it chose, a workspace
// size). A plan follows its operands to another device by planning again there.
//
//   ops::matmul(x, false, w, false, y);          // y = x * w
//   ops::activation_forward(Activation::Relu, y, y);
//   Conv2dPlan plan(geometry, Device::CPU);      // once
//   ops::conv2d_forward(plan, x, kernel, bias, y);

#include <cstdint>
#include <memory>
#include <vector>

#include "cohort/core/device_event.hpp"
#include "cohort/tensor/geometry.hpp"
#include "cohort/tensor/running_sums.hpp"
#include "cohort/tensor/tensor.hpp"

namespace cohort {

// What a backend prepared for one geometry; each backend derives its own. Shared, so that recorded work
// (capture.hpp) keeps the plans it was recorded with.
struct PlanState : std::enable_shared_from_this<PlanState> {
  virtual ~PlanState() = default;
};

// A layer's plan for one op: its geometry (the batch size is taken from each call's operands) and the
// state its device's backend made for it.
template <class Geometry>
class Plan {
 public:
  Plan() = default;
  Plan(const Geometry& geometry, Device device);

  const Geometry& geometry() const { return geometry_; }
  Device device() const { return device_; }
  const PlanState* state() const { return state_.get(); }
  // Plans again when the operands have moved to another device.
  void prepare(Device device);

 private:
  Geometry geometry_{};
  Device device_ = Device::CPU;
  std::shared_ptr<const PlanState> state_;
};

using Conv2dPlan = Plan<Conv2dGeometry>;
using Pool2dPlan = Plan<Pool2dGeometry>;
using BatchNormPlan = Plan<BatchNormGeometry>;
extern template class Plan<Conv2dGeometry>;
extern template class Plan<Pool2dGeometry>;
extern template class Plan<BatchNormGeometry>;

namespace ops {

// Returns when every op queued on `device` so far has finished (a benchmark's clock). Ops return before they
// finish only on asynchronous devices.
void synchronize(Device device);
// A point after every op queued on `device` so far, for a reader on another stream or thread to await
// (core/device_event.hpp) instead of stopping this thread; null where ops finish before they return.
DeviceEventPtr record_event(Device device);
// Queues source -> destination (same type and count; destination on the host, page-locked by Tensor::pinned
// for a GPU's copy to overlap: other host memory is filled before the call returns) after the ops queued on
// source's device so far, and returns at once with the point at which destination holds the bytes: nothing
// may touch destination before it. Ops queued later on source's device may write source.
DeviceEventPtr copy_to_host_async(const Tensor& source, const Tensor& destination);

// ---- elementwise and reductions
void fill(const Tensor& x, float value);
// The one op whose operands may be on different devices: a synchronous transfer (CopyStream for
// asynchronous ones).
void copy(const Tensor& source, const Tensor& destination);
// destination = source in destination's element type, on one device: between float32, bfloat16 and float16
// (rounding to nearest even, NaN and infinity kept, float16 subnormals produced), and int32 to float32.
void convert(const Tensor& source, const Tensor& destination);
void axpy(float alpha, const Tensor& x, const Tensor& y);            // y += alpha * x
void scale(const Tensor& x, float alpha);                            // x *= alpha
void multiply(const Tensor& a, const Tensor& b, const Tensor& out);  // out = a .* b
double sum(const Tensor& x);
double sum_of_squares(const Tensor& x);

// ---- matrices: c = alpha * op(a) * op(b) + beta * c, all rank 2
void matmul(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, const Tensor& c,
            float alpha = 1.0f, float beta = 0.0f);
// y[..., j] += bias[j]
void add_bias(const Tensor& y, const Tensor& bias);
// dbias[j] = sum over all leading axes of dy[..., j]  (overwrites)
void bias_gradient(const Tensor& dy, const Tensor& dbias);

// ---- activations; Softmax acts on the last axis. Backward uses the forward *output* y.
void activation_forward(Activation activation, const Tensor& x, const Tensor& y);
void activation_backward(Activation activation, const Tensor& y, const Tensor& dy, const Tensor& dx);

// ---- convolution (bias may be undefined)
void conv2d_forward(Conv2dPlan& plan, const Tensor& x, const Tensor& kernel, const Tensor& bias, const Tensor& y);
// Overwrites dkernel and dbias (when defined); dx is skipped when undefined (first layer).
void conv2d_backward(Conv2dPlan& plan, const Tensor& x, const Tensor& kernel, const Tensor& dy, const Tensor& dx,
                     const Tensor& dkernel, const Tensor& dbias);

// ---- pooling (max or average, as the plan's geometry says); backward uses the forward's x and y
void pool2d_forward(Pool2dPlan& plan, const Tensor& x, const Tensor& y);
void pool2d_backward(Pool2dPlan& plan, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx);

// ---- batch normalization over all axes but the last (channels)
// Training: normalizes with the batch statistics and returns them (mean, biased variance).
void batch_norm_forward_training(BatchNormPlan& plan, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                 const Tensor& y, const Tensor& batch_mean, const Tensor& batch_variance);
void batch_norm_forward_inference(BatchNormPlan& plan, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                  const Tensor& mean, const Tensor& variance, const Tensor& y);
void batch_norm_backward(BatchNormPlan& plan, const Tensor& x, const Tensor& gamma, const Tensor& dy,
                         const Tensor& batch_mean, const Tensor& batch_variance, const Tensor& dx, const Tensor& dgamma,
                         const Tensor& dbeta);
// Backward of batch_norm_forward_inference: the statistics are constants.
void batch_norm_backward_inference(BatchNormPlan& plan, const Tensor& x, const Tensor& gamma, const Tensor& dy,
                                   const Tensor& mean, const Tensor& variance, const Tensor& dx, const Tensor& dgamma,
                                   const Tensor& dbeta);
// moving = moving * momentum + batch * (1 - momentum)
void moving_average_update(const Tensor& moving, const Tensor& batch, float momentum);

// ---- dropout: mask[i] = 0 with probability rate, else 1 / (1 - rate); drawn from a counter-based
// generator keyed by (seed, i), so the mask does not depend on the thread count.
void dropout_mask(const Tensor& mask, float rate, std::uint64_t seed);
// The mask of derive_seed(seed, step), `step` read on the device from a step counter (step_counter()): the
// mask of each replay of a captured step (capture.hpp) is that step's own.
void dropout_mask(const Tensor& mask, float rate, std::uint64_t seed, const Tensor& step);
// A 64-bit counter on `device` (int32 (2), low word first), zero, for dropout_mask() and capture.hpp's
// set_step_counter().
Tensor step_counter(Device device);
// A float32 scalar on `device` holding `value` (a learning rate for the updates below).
Tensor scalar(float value, Device device);

// ---- 8-bit images to the float32 a model takes, on the device that trains (a quarter of the bytes to copy):
// out[n, y, x, c] = (v / 255 - mean[c]) / stddev[c], v = images[s, y + dy, x' + dx, c] or 0 where that falls
// outside the image, x' = W - 1 - x where flip is not 0, else x; (dy, dx, flip) = draws[n, 0..2];
// s = n, or indices[n] where indices is defined (images then hold a whole data set, resident on the device).
// images uint8 (S, H, W, C), indices int32 (N) or undefined (S = N), draws int32 (N, 3), mean and stddev
// float32 (C), out float32 (N, H, W, C). The same values, bit for bit, as data::random_crop,
// random_flip_horizontal and normalize on the host. An index outside [0, S) is an InvalidArgument where the
// indices are on the CPU and gives zeros on a device (its check there would cost a read-back).
void expand_images(const Tensor& images, const Tensor& indices, const Tensor& draws, const Tensor& mean,
                   const Tensor& stddev, const Tensor& out);

// ---- fused passes: an op above and the elementwise activation (Linear, Relu, Sigmoid, Tanh) of its output y,
// in one pass where the backend can, with the unfused ops' results. The backward ones take dL/dy of that y.
void conv2d_activation_forward(Conv2dPlan& plan, const Tensor& x, const Tensor& kernel, const Tensor& bias,
                               Activation activation, const Tensor& y);
// y = activation(y + bias)
void bias_activation_forward(const Tensor& y, const Tensor& bias, Activation activation);
// dpre = dy * activation'(y); dbias = dpre summed over all leading axes (overwrites)
void activation_bias_backward(Activation activation, const Tensor& y, const Tensor& dy, const Tensor& dpre,
                              const Tensor& dbias);
void batch_norm_activation_forward_training(BatchNormPlan& plan, const Tensor& x, const Tensor& gamma,
                                            const Tensor& beta, Activation activation, const Tensor& y,
                                            const Tensor& batch_mean, const Tensor& batch_variance);
void batch_norm_activation_forward_inference(BatchNormPlan& plan, const Tensor& x, const Tensor& gamma,
                                             const Tensor& beta, const Tensor& mean, const Tensor& variance,
                                             Activation activation, const Tensor& y);
// Backward of batch_norm_activation_forward_training. y is its output, beta its shift: a backend may use
// either (the CPU recomputes y from x, gamma and beta; the default reads y), so both must be the forward's.
void batch_norm_activation_backward(BatchNormPlan& plan, const Tensor& x, const Tensor& y, const Tensor& gamma,
                                    const Tensor& beta, const Tensor& dy, const Tensor& batch_mean, const Tensor& batch_variance,
                                    Activation activation, const Tensor& dx, const Tensor& dgamma,
                                    const Tensor& dbeta);

// ---- optimizer updates (Keras semantics, see optim/), fused into one pass over each variable, for any
// number of variables at once with the same hyperparameters: a GPU updates them all in one launch. The
// learning rate is a float32 scalar on the variables' device, read when the update runs, so that a captured
// step (capture.hpp) takes each replay's rate.
// L2 weight decay adds weight_decay * w to the gradient first.
// SGD: with momentum, v = momentum * v - lr * g; w += v (Nesterov: w += momentum * v - lr * g).
struct SgdOperands {
  Tensor value, gradient, velocity;  // velocity undefined without momentum
};
void sgd_update(const std::vector<SgdOperands>& variables, const Tensor& learning_rate, float momentum, bool nesterov,
                float weight_decay);
// Adam: m, v moments; the caller folds bias correction into the learning rate.
struct AdamOperands {
  Tensor value, gradient, m, v;
};
void adam_update(const std::vector<AdamOperands>& variables, const Tensor& learning_rate, float beta_1, float beta_2,
                 float epsilon, float weight_decay);
// RMSprop: mean_square (and mean_gradient when centered, velocity when momentum > 0) as in Keras.
struct RmspropOperands {
  Tensor value, gradient, mean_square, mean_gradient, velocity;
};
void rmsprop_update(const std::vector<RmspropOperands>& variables, const Tensor& learning_rate, float rho, float momentum,
                    float epsilon, float weight_decay);

// ---- losses and metrics. labels: shape (N) of class indices, or (N, C) one-hot / soft targets.
// Mean categorical cross-entropy of softmax(logits), computed stably; writes dlogits when defined.
double softmax_cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& dlogits);
// Mean categorical cross-entropy of probabilities clipped to [1e-7, 1 - 1e-7] (Keras); writes dprobs.
double categorical_cross_entropy(const Tensor& probabilities, const Tensor& labels, const Tensor& dprobabilities);
// Number of rows whose arg-max matches the label.
std::int64_t count_correct(const Tensor& scores, const Tensor& labels);
// The same three, adding the batch's sum (of the rows' losses, not their mean; of the right rows) to slot `slot`
// of `sums` on the tensors' device, without waiting for it: the value is there for the next sums.read().
void softmax_cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& dlogits, const RunningSums& sums,
                           int slot);
void categorical_cross_entropy(const Tensor& probabilities, const Tensor& labels, const Tensor& dprobabilities,
                               const RunningSums& sums, int slot);
void count_correct(const Tensor& scores, const Tensor& labels, const RunningSums& sums, int slot);
// Number of rows whose label is among the k highest scores (ties count against the label); adding to a slot as above.
void count_top_k(const Tensor& scores, const Tensor& labels, int k, const RunningSums& sums, int slot);
// Element-wise losses and hits (geometry.hpp) over a prediction (N, ...) and targets of as many values per row
// (float32, or int32): adds each row's mean over its outputs to slot `slot` of `sums`, without
// waiting, and writes the gradient of the mean over every output into `gradient` when it is defined.
void elementwise_loss(ElementwiseLoss loss, const Tensor& prediction, const Tensor& targets, const Tensor& gradient,
                      const RunningSums& sums, int slot);
// The mean over every output, read back at once.
double elementwise_loss(ElementwiseLoss loss, const Tensor& prediction, const Tensor& targets,
                        const Tensor& gradient = Tensor());

}  // namespace ops
}  // namespace cohort
