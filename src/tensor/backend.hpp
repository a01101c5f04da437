#pragma once
// Backend: everything a device must compute for layers, losses and optimizers, listed once. The op layer
// (ops.cpp) has checked shapes and devices before any call, so a backend only computes; its operands
// all live on its device, except where a signature says host. A new device implements this interface in
// its own folder (src/tensor/<device>/) with an allocator and a copy stream, and registers in
// backend.cpp (docs/adding_a_backend.md).
#include <fmt/format.h>

#include <memory>
#include <span>
#include <string>

#include "cohort/core/device_event.hpp"
#include "cohort/tensor/allocator.hpp"
#include "cohort/tensor/ops.hpp"
#include "cohort/tensor/running_sums.hpp"

namespace cohort {

// An ordered queue of copies on one device (a CUDA stream); copies between host and device memory
// may run while the caller goes on. A copy must not start before the device work already queued when it
// was enqueued (on an asynchronous device: the stream waits for an event of the compute stream), since
// its destination may be a buffer that earlier kernels still read.
class BackendStream {
 public:
  virtual ~BackendStream() = default;
  // Copies bytes between two tensors' storage; either side may be host memory. Both stay alive and
  // untouched until synchronize() returns.
  virtual void enqueue_copy(const Tensor& source, const Tensor& destination) = 0;
  // Waits for every enqueued copy; rethrows the first failure.
  virtual void synchronize() = 0;
};

// A tensor as rows along its last axis (a scalar is one row of one): what the row-wise kernels of every
// backend (biases, softmax, the channels of batch normalization) iterate over.
struct Rows {
  std::int64_t count, width;
};
inline Rows rows_of(const Tensor& t) {
  const std::int64_t width = t.rank() == 0 ? 1 : t.dim(t.rank() - 1);
  return {width == 0 ? 0 : t.numel() / width, width};
}

// The plan of an op a backend does not prepare for (its geometry, passed with each call, is enough).
struct NoPlan : PlanState {};

// Ops recorded on a device (a CUDA graph): launch() queues them again, in order, on the buffers they were
// recorded with.
class BackendGraph {
 public:
  virtual ~BackendGraph() = default;
  virtual void launch() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Device device() const = 0;
  virtual Allocator& allocator() = 0;
  virtual std::unique_ptr<BackendStream> make_stream() = 0;
  // Returns when every op queued so far has finished (a no-op where ops finish before they return).
  virtual void synchronize() = 0;
  // A point after every op queued so far; null where ops finish before they return.
  virtual DeviceEventPtr record_event() { return nullptr; }

  // ---- capture: between begin_capture() and end_capture(), the ops the calling thread queues on this device
  // are recorded instead of run (capture.hpp). An op that makes the host wait (synchronize, sum, a copy to or
  // from the host, an event) cannot be recorded: it throws DeviceError, and so does end_capture() after it,
  // which always ends the capture. The default: this backend cannot record (begin_capture() says so).
  virtual void begin_capture();
  virtual std::unique_ptr<BackendGraph> end_capture();
  // destination (4 or 8 bytes on this device) = the low bytes of `bits`, queued after the ops before it with
  // the value as the kernel's argument: a value the host sets for a step, without waiting.
  virtual void write_bits(const Tensor& destination, std::uint64_t bits) = 0;

  // ---- 16-bit operands: whether this backend computes `kernel` on operands of `type` itself (ops.cpp says which
  // operands are then 16-bit and which float32); the op layer runs the rest through float32 stand-ins.
  enum class Kernel16 { Conv2d, Matmul, Elementwise, MaxPooling, BatchNorm };
  virtual bool computes(Kernel16 kernel, DType type) const {
    (void)kernel, (void)type;
    return false;
  }
  // What computes 16-bit `type` here, for reports (devices.hpp kernels_for).
  virtual std::string kernels_for(DType type) const {
    return fmt::format("float32 stand-ins: this backend has no {} kernels", dtype_name(type));
  }

  // ---- memory: host pointers are on the CPU; the tensors on this device
  virtual void copy_from_host(const void* source, const Tensor& destination) = 0;
  virtual void copy_to_host(const Tensor& source, void* destination) = 0;
  // copy_to_host queued after the ops queued so far, returning at once: `destination` (a host tensor,
  // page-locked for the copy to overlap) holds the bytes once the returned point is passed. Both tensors stay
  // allocated until the device has passed it, even where nobody awaits the point. By default the copy is done
  // on return.
  virtual DeviceEventPtr copy_to_host_async(const Tensor& source, const Tensor& destination) {
    copy_to_host(source, destination.host_bytes().data());
    return nullptr;
  }
  // Every byte of x zero: zero in any element type.
  virtual void zero(const Tensor& x) = 0;
  // destination = source in destination's element type (ops::convert's rules): one of them float32, the
  // other bfloat16, float16 or (as the source) int32.
  virtual void convert(const Tensor& source, const Tensor& destination) = 0;

  // ---- plans
  virtual std::shared_ptr<const PlanState> plan(const Conv2dGeometry& geometry) = 0;
  virtual std::shared_ptr<const PlanState> plan(const Pool2dGeometry& geometry) = 0;
  virtual std::shared_ptr<const PlanState> plan(const BatchNormGeometry& geometry) = 0;

  // ---- elementwise and reductions
  virtual void fill(const Tensor& x, float value) = 0;
  virtual void copy(const Tensor& source, const Tensor& destination) = 0;
  virtual void axpy(float alpha, const Tensor& x, const Tensor& y) = 0;
  virtual void scale(const Tensor& x, float alpha) = 0;
  virtual void multiply(const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  virtual double sum(const Tensor& x) = 0;
  virtual double sum_of_squares(const Tensor& x) = 0;

  // ---- matrices and biases
  virtual void matmul(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, const Tensor& c,
                      float alpha, float beta) = 0;
  virtual void add_bias(const Tensor& y, const Tensor& bias) = 0;
  virtual void bias_gradient(const Tensor& dy, const Tensor& dbias) = 0;

  // ---- activations
  virtual void activation_forward(Activation activation, const Tensor& x, const Tensor& y) = 0;
  virtual void activation_backward(Activation activation, const Tensor& y, const Tensor& dy, const Tensor& dx) = 0;

  // ---- convolution, pooling, batch normalization: `g` is the plan's geometry for this call's batch
  virtual void conv2d_forward(const PlanState* plan, const Conv2dGeometry& g, const Tensor& x, const Tensor& kernel,
                              const Tensor& bias, const Tensor& y) = 0;
  virtual void conv2d_backward(const PlanState* plan, const Conv2dGeometry& g, const Tensor& x, const Tensor& kernel,
                               const Tensor& dy, const Tensor& dx, const Tensor& dkernel, const Tensor& dbias) = 0;
  virtual void pool2d_forward(const PlanState* plan, const Pool2dGeometry& g, const Tensor& x, const Tensor& y) = 0;
  virtual void pool2d_backward(const PlanState* plan, const Pool2dGeometry& g, const Tensor& x, const Tensor& y,
                               const Tensor& dy, const Tensor& dx) = 0;
  virtual void batch_norm_forward_training(const PlanState* plan, const BatchNormGeometry& g, const Tensor& x,
                                           const Tensor& gamma, const Tensor& beta, const Tensor& y,
                                           const Tensor& batch_mean, const Tensor& batch_variance) = 0;
  virtual void batch_norm_forward_inference(const PlanState* plan, const BatchNormGeometry& g, const Tensor& x,
                                            const Tensor& gamma, const Tensor& beta, const Tensor& mean,
                                            const Tensor& variance, const Tensor& y) = 0;
  virtual void batch_norm_backward(const PlanState* plan, const BatchNormGeometry& g, const Tensor& x,
                                   const Tensor& gamma, const Tensor& dy, const Tensor& batch_mean,
                                   const Tensor& batch_variance, const Tensor& dx, const Tensor& dgamma,
                                   const Tensor& dbeta) = 0;
  virtual void batch_norm_backward_inference(const PlanState* plan, const BatchNormGeometry& g, const Tensor& x,
                                             const Tensor& gamma, const Tensor& dy, const Tensor& mean,
                                             const Tensor& variance, const Tensor& dx, const Tensor& dgamma,
                                             const Tensor& dbeta) = 0;
  virtual void moving_average_update(const Tensor& moving, const Tensor& batch, float momentum) = 0;
  // The mask of derive_seed(seed, *step) where `step` (a step counter, ops.hpp) is defined, else of `seed`.
  virtual void dropout_mask(const Tensor& mask, float rate, std::uint64_t seed, const Tensor& step) = 0;
  virtual void expand_images(const Tensor& images, const Tensor& indices, const Tensor& draws, const Tensor& mean,
                             const Tensor& stddev, const Tensor& out) = 0;

  // ---- fused passes: an op and the elementwise activation (Linear, Relu, Sigmoid, Tanh) of its output y in one
  // pass; the backward ones take dL/dy of that activated output. The defaults run the unfused ops one after
  // the other, so a backend overrides only what it can do in fewer passes over memory.
  virtual void conv2d_forward_activated(const PlanState* plan, const Conv2dGeometry& g, const Tensor& x,
                                        const Tensor& kernel, const Tensor& bias, Activation activation,
                                        const Tensor& y);
  // y = activation(y + bias)
  virtual void bias_activation_forward(const Tensor& y, const Tensor& bias, Activation activation);
  // dpre = dy * activation'(y), dbias = its sum over the rows
  virtual void activation_bias_backward(Activation activation, const Tensor& y, const Tensor& dy, const Tensor& dpre,
                                        const Tensor& dbias);
  virtual void batch_norm_activation_forward_training(const PlanState* plan, const BatchNormGeometry& g,
                                                      const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                                      Activation activation, const Tensor& y, const Tensor& batch_mean,
                                                      const Tensor& batch_variance);
  virtual void batch_norm_activation_forward_inference(const PlanState* plan, const BatchNormGeometry& g,
                                                       const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                                       const Tensor& mean, const Tensor& variance,
                                                       Activation activation, const Tensor& y);
  virtual void batch_norm_activation_backward(const PlanState* plan, const BatchNormGeometry& g, const Tensor& x,
                                              const Tensor& y, const Tensor& gamma, const Tensor& beta,
                                              const Tensor& dy,
                                              const Tensor& batch_mean, const Tensor& batch_variance,
                                              Activation activation, const Tensor& dx, const Tensor& dgamma,
                                              const Tensor& dbeta);

  // ---- optimizer updates: the learning rate is a float32 scalar on this device, read when the update runs
  virtual void sgd_update(const std::vector<ops::SgdOperands>& variables, const Tensor& learning_rate, float momentum,
                          bool nesterov, float weight_decay) = 0;
  virtual void adam_update(const std::vector<ops::AdamOperands>& variables, const Tensor& learning_rate, float beta_1,
                           float beta_2, float epsilon, float weight_decay) = 0;
  virtual void rmsprop_update(const std::vector<ops::RmspropOperands>& variables, const Tensor& learning_rate,
                              float rho, float momentum, float epsilon, float weight_decay) = 0;

  // ---- losses and metrics: each adds its batch's sum (of the rows' losses; of the right rows) to slot `slot` of
  // `sums` without waiting for it; sum_target() (backend_access.hpp) gives the slot's and the bad-label record's
  // addresses. A backend that cannot check the labels before its kernels run records the first bad one there.
  virtual void softmax_cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& dlogits,
                                     const RunningSums& sums, int slot) = 0;
  virtual void categorical_cross_entropy(const Tensor& probabilities, const Tensor& labels, const Tensor& dprobabilities,
                                         const RunningSums& sums, int slot) = 0;
  virtual void count_correct(const Tensor& scores, const Tensor& labels, const RunningSums& sums, int slot) = 0;
  virtual void count_top_k(const Tensor& scores, const Tensor& labels, int k, const RunningSums& sums, int slot) = 0;
  // Targets are float32 with the prediction's element count, `gradient` undefined or float32 like the prediction.
  virtual void elementwise_loss(ElementwiseLoss loss, const Tensor& prediction, const Tensor& targets,
                                const Tensor& gradient, const RunningSums& sums, int slot) = 0;
};

// The backend of `device`; DeviceError naming the build option when this build has none for it.
Backend& backend_for(Device device);

// Where this thread captures work on their device, keeps the operands of an op for as long as the captured work
// lives: its replays read and write their memory (capture.cpp).
void keep_while_captured(std::span<const Tensor* const> operands);
void keep_while_captured(const Tensor& operand);

// The choices of devices.hpp, for the GPU backend as it starts: from then on they may not change.
struct GpuChoices {
  bool tf32 = true;
  bool deterministic = true;
};
GpuChoices gpu_choices_from_now_on();

}  // namespace cohort
