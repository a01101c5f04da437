#pragma once
// The CUDA backend: cuDNN convolutions, cuBLAS products, the kernels of kernels.cu for the rest, all in
// order on one compute stream of the process's GPU; copies on streams of their own that wait for the
// compute stream. Device memory comes from a caching allocator over cudaMalloc, so a training step that
// allocates the same buffers each time costs no cudaMalloc after the first. Calls may come from several
// threads: the library handles are used under a lock, and every thread works on the same stream.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstdint>
#include <mutex>
#include <vector>

#include "tensor/backend.hpp"
#include "tensor/capturing_thread.hpp"

namespace cohort::cuda {

// Memory from the CUDA runtime: the GPU's (cudaMalloc), or page-locked host memory (cudaHostAlloc) that
// copies reach at full bus speed and asynchronously. Out of memory is a DeviceError with the bytes asked
// for. Allocations and frees select the backend's GPU first: they may come from any thread (a data
// loader's, a communicator's).
class CudaAllocator final : public Allocator {
 public:
  enum class Memory { Device, PinnedHost };
  CudaAllocator(Memory memory, int ordinal) : memory_(memory), ordinal_(ordinal) {}
  std::string name() const override;
  void* allocate(std::size_t bytes) override;
  void deallocate(void* pointer, std::size_t bytes) noexcept override;
  AllocatorStats stats() const override;
  void reset_peak() override;

 private:
  Memory memory_;
  int ordinal_;
  mutable std::mutex mutex_;
  AllocatorStats stats_;
};

// Scratch device memory for one call, returned to the caching allocator when the call's work is queued:
// later work on the same stream runs after it, so reusing the block is safe.
class Scratch {
 public:
  Scratch(Allocator& allocator, std::size_t bytes);
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(pointer_); }

 private:
  Allocator& allocator_;
  std::size_t bytes_;
  void* pointer_;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend();  // DeviceError naming the reason when no usable GPU is visible

  Device device() const override { return Device::CUDA; }
  bool computes(Kernel16 kernel, DType type) const override;
  std::string kernels_for(DType type) const override;
  Allocator& allocator() override { return *allocator_; }
  // Page-locked host memory for staging, through a cache of its own.
  Allocator& pinned_allocator() { return *pinned_; }
  std::unique_ptr<BackendStream> make_stream() override;
  void synchronize() override;
  DeviceEventPtr record_event() override;
  // Stream capture of the calling thread's work on the compute stream; the blocks allocated meanwhile go to a
  // private pool that the graph holds.
  void begin_capture() override;
  std::unique_ptr<BackendGraph> end_capture() override;
  void write_bits(const Tensor& destination, std::uint64_t bits) override;
  void copy_from_host(const void* source, const Tensor& destination) override;
  void copy_to_host(const Tensor& source, void* destination) override;
  DeviceEventPtr copy_to_host_async(const Tensor& source, const Tensor& destination) override;
  void zero(const Tensor& x) override;
  void convert(const Tensor& source, const Tensor& destination) override;

  std::shared_ptr<const PlanState> plan(const Conv2dGeometry& geometry) override;
  std::shared_ptr<const PlanState> plan(const Pool2dGeometry& geometry) override;
  std::shared_ptr<const PlanState> plan(const BatchNormGeometry& geometry) override;

  void fill(const Tensor& x, float value) override;
  void copy(const Tensor& source, const Tensor& destination) override;
  void axpy(float alpha, const Tensor& x, const Tensor& y) override;
  void scale(const Tensor& x, float alpha) override;
  void multiply(const Tensor& a, const Tensor& b, const Tensor& out) override;
  double sum(const Tensor& x) override;
  double sum_of_squares(const Tensor& x) override;
  void matmul(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, const Tensor& c, float alpha,
              float beta) override;
  void add_bias(const Tensor& y, const Tensor& bias) override;
  void bias_activation_forward(const Tensor& y, const Tensor& bias, Activation activation) override;
  void bias_gradient(const Tensor& dy, const Tensor& dbias) override;
  void activation_forward(Activation activation, const Tensor& x, const Tensor& y) override;
  void activation_backward(Activation activation, const Tensor& y, const Tensor& dy, const Tensor& dx) override;

  void conv2d_forward(const PlanState* plan, const Conv2dGeometry& g, const Tensor& x, const Tensor& kernel,
                      const Tensor& bias, const Tensor& y) override;
  void conv2d_forward_activated(const PlanState* plan, const Conv2dGeometry& g, const Tensor& x, const Tensor& kernel,
                                const Tensor& bias, Activation activation, const Tensor& y) override;
  void conv2d_backward(const PlanState* plan, const Conv2dGeometry& g, const Tensor& x, const Tensor& kernel,
                       const Tensor& dy, const Tensor& dx, const Tensor& dkernel, const Tensor& dbias) override;
  void pool2d_forward(const PlanState* plan, const Pool2dGeometry& g, const Tensor& x, const Tensor& y) override;
  void pool2d_backward(const PlanState* plan, const Pool2dGeometry& g, const Tensor& x, const Tensor& y,
                       const Tensor& dy, const Tensor& dx) override;
  void batch_norm_forward_training(const PlanState* plan, const BatchNormGeometry& g, const Tensor& x,
                                   const Tensor& gamma, const Tensor& beta, const Tensor& y, const Tensor& batch_mean,
                                   const Tensor& batch_variance) override;
  void batch_norm_forward_inference(const PlanState* plan, const BatchNormGeometry& g, const Tensor& x,
                                    const Tensor& gamma, const Tensor& beta, const Tensor& mean,
                                    const Tensor& variance, const Tensor& y) override;
  void batch_norm_backward(const PlanState* plan, const BatchNormGeometry& g, const Tensor& x, const Tensor& gamma,
                           const Tensor& dy, const Tensor& batch_mean, const Tensor& batch_variance, const Tensor& dx,
                           const Tensor& dgamma, const Tensor& dbeta) override;
  void batch_norm_backward_inference(const PlanState* plan, const BatchNormGeometry& g, const Tensor& x,
                                     const Tensor& gamma, const Tensor& dy, const Tensor& mean, const Tensor& variance,
                                     const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) override;
  void batch_norm_activation_forward_training(const PlanState* plan, const BatchNormGeometry& g, const Tensor& x,
                                              const Tensor& gamma, const Tensor& beta, Activation activation,
                                              const Tensor& y, const Tensor& batch_mean,
                                              const Tensor& batch_variance) override;
  void batch_norm_activation_forward_inference(const PlanState* plan, const BatchNormGeometry& g, const Tensor& x,
                                               const Tensor& gamma, const Tensor& beta, const Tensor& mean,
                                               const Tensor& variance, Activation activation, const Tensor& y) override;
  void batch_norm_activation_backward(const PlanState* plan, const BatchNormGeometry& g, const Tensor& x, const Tensor& y,
                                      const Tensor& gamma, const Tensor& beta, const Tensor& dy,
                                      const Tensor& batch_mean, const Tensor& batch_variance, Activation activation,
                                      const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) override;
  void moving_average_update(const Tensor& moving, const Tensor& batch, float momentum) override;
  void dropout_mask(const Tensor& mask, float rate, std::uint64_t seed, const Tensor& step) override;
  void expand_images(const Tensor& images, const Tensor& indices, const Tensor& draws, const Tensor& mean,
                     const Tensor& stddev, const Tensor& out) override;

  void sgd_update(const std::vector<ops::SgdOperands>& variables, const Tensor& learning_rate, float momentum,
                  bool nesterov, float weight_decay) override;
  void adam_update(const std::vector<ops::AdamOperands>& variables, const Tensor& learning_rate, float beta_1,
                   float beta_2, float epsilon, float weight_decay) override;
  void rmsprop_update(const std::vector<ops::RmspropOperands>& variables, const Tensor& learning_rate, float rho,
                      float momentum, float epsilon, float weight_decay) override;

  void softmax_cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& dlogits, const RunningSums& sums,
                             int slot) override;
  void categorical_cross_entropy(const Tensor& probabilities, const Tensor& labels, const Tensor& dprobabilities,
                                 const RunningSums& sums, int slot) override;
  void count_correct(const Tensor& scores, const Tensor& labels, const RunningSums& sums, int slot) override;
  void count_top_k(const Tensor& scores, const Tensor& labels, int k, const RunningSums& sums, int slot) override;
  void elementwise_loss(ElementwiseLoss loss, const Tensor& prediction, const Tensor& targets, const Tensor& gradient,
                        const RunningSums& sums, int slot) override;

  int ordinal() const { return ordinal_; }
  cudaStream_t compute_stream() const { return compute_; }
  cudnnHandle_t cudnn() const { return cudnn_; }
  // Held while a cuBLAS or cuDNN handle is in use.
  std::mutex& handle_mutex() { return handle_mutex_; }
  // Makes this backend's GPU current on the calling thread, and holds an op's place while it queues its work:
  // not while another thread captures here, nor across the start of a capture (CUDA captures the stream, so the
  // op would join that recording; capturing_thread.hpp).
  [[nodiscard]] CapturingThread::OpScope activate() const;
  // Waits for the compute stream; `what` names the op in an error.
  void wait(const char* what);
  // Keeps `tensors`, which queued work before `event` still uses, until the GPU has passed it, then destroys
  // the event: a copy whose reader gave up must not write into memory handed to another tensor meanwhile.
  void hold_until_passed(cudaEvent_t event, std::vector<Tensor> tensors);
  // Destroys the held events that the GPU has passed, letting their tensors go.
  void release_passed_holds();
  // The thread capturing work here, if any.
  const CapturingThread& capturing() const { return capturing_; }
  // TF32 tensor cores for float32 products and convolutions (devices.hpp allow_tf32).
  bool allow_tf32() const { return allow_tf32_; }
  // Convolution algorithms: deterministic ones by cuDNN's heuristics, else the fastest by timing (devices.hpp).
  bool deterministic() const { return deterministic_; }

 private:
  // Rows summed on the device then on the host, in a fixed order.
  double reduce(const Tensor& x, bool squares, const char* what);
  // Batch normalization's backward passes: inv_std, dbeta and dgamma, dy taken through the gradient of the
  // activation whose output `activated` is, when defined.
  void parameter_gradients(const BatchNormGeometry& g, const Tensor& x, const Tensor& dy, const Tensor& activated,
                           Activation activation, const Tensor& mean, const Tensor& variance, float* inv_std,
                           const Tensor& dgamma, const Tensor& dbeta);
  // Runs a loss or metric kernel per row and adds the rows' values to a slot of `sums`, on the device.
  // `class_indices`: the labels are one class index per row, which the kernels check.
  template <class Launch>
  void add_row_sums(const char* what, const Tensor& scores, const Tensor& labels, bool class_indices,
                    const RunningSums& sums, int slot, Launch&& launch);

  int ordinal_ = 0;
  bool allow_tf32_ = false;
  bool deterministic_ = true;
  std::unique_ptr<CachingAllocator> allocator_;
  std::unique_ptr<Allocator> pinned_;
  std::shared_ptr<void> capture_pool_;  // the private pool of the capture under way
  CapturingThread capturing_;
  cudaStream_t compute_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  std::mutex handle_mutex_;
  struct Held {
    cudaEvent_t event;
    std::vector<Tensor> tensors;
  };
  std::mutex held_mutex_;
  std::vector<Held> held_;  // by hold_until_passed; released as later events are recorded
};

}  // namespace cohort::cuda
