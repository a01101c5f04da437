#pragma once
// The CPU backend: Eigen GEMM, im2col and Winograd convolutions, OpenMP loops. Its kernels live in the
// files of this folder, one family each. One instance serves Device::CPU with host memory; another
// serves Device::Emulated with storage of its own (backend.cpp).
#include <atomic>
#include <cstdint>

#include "tensor/backend.hpp"

namespace cohort::cpu {

// Row-major single-precision GEMM: c[m x n] = alpha * op(a) * op(b) + beta * c, with leading dimensions.
// Multithreaded, unless called from inside an OpenMP parallel region.
void gemm(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
          const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc);

// Element counts above which an element-wise loop is split across the OpenMP threads; smaller ones stay on
// the calling thread, where starting the threads would cost more than they save.
inline constexpr std::int64_t kParallelThreshold = 1 << 15;

class CpuBackend final : public Backend {
 public:
  CpuBackend(Device device, std::unique_ptr<Allocator> allocator);

  Device device() const override { return device_; }
  Allocator& allocator() override { return *allocator_; }
  std::unique_ptr<BackendStream> make_stream() override;
  void synchronize() override {}
  bool computes(Kernel16 kernel, DType type) const override;
  std::string kernels_for(DType type) const override;
  void copy_from_host(const void* source, const Tensor& destination) override;
  void copy_to_host(const Tensor& source, void* destination) override;
  // How many times values were read back to the host so far: on the emulated device, each is a point where a
  // GPU's host would wait for its work.
  std::uint64_t copies_to_host() const { return copies_to_host_.load(std::memory_order_relaxed); }
  // The bytes are taken at once, as a GPU takes them at that point of its queue, but land in `destination`
  // only when a reader first asks whether the point is passed: on the emulated device, a reader that does not
  // await it sees the old bytes, as it could on a GPU.
  DeviceEventPtr copy_to_host_async(const Tensor& source, const Tensor& destination) override;
  void zero(const Tensor& x) override;
  void write_bits(const Tensor& destination, std::uint64_t bits) override;
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
  void bias_gradient(const Tensor& dy, const Tensor& dbias) override;
  void activation_forward(Activation activation, const Tensor& x, const Tensor& y) override;
  void activation_backward(Activation activation, const Tensor& y, const Tensor& dy, const Tensor& dx) override;

  void conv2d_forward(const PlanState* plan, const Conv2dGeometry& g, const Tensor& x, const Tensor& kernel,
                      const Tensor& bias, const Tensor& y) override;
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
  void moving_average_update(const Tensor& moving, const Tensor& batch, float momentum) override;
  void dropout_mask(const Tensor& mask, float rate, std::uint64_t seed, const Tensor& step) override;
  void expand_images(const Tensor& images, const Tensor& indices, const Tensor& draws, const Tensor& mean,
                     const Tensor& stddev, const Tensor& out) override;

  void conv2d_forward_activated(const PlanState* plan, const Conv2dGeometry& g, const Tensor& x, const Tensor& kernel,
                                const Tensor& bias, Activation activation, const Tensor& y) override;
  void bias_activation_forward(const Tensor& y, const Tensor& bias, Activation activation) override;
  void activation_bias_backward(Activation activation, const Tensor& y, const Tensor& dy, const Tensor& dpre,
                                const Tensor& dbias) override;
  void batch_norm_activation_forward_training(const PlanState* plan, const BatchNormGeometry& g, const Tensor& x,
                                              const Tensor& gamma, const Tensor& beta, Activation activation,
                                              const Tensor& y, const Tensor& batch_mean,
                                              const Tensor& batch_variance) override;
  void batch_norm_activation_forward_inference(const PlanState* plan, const BatchNormGeometry& g, const Tensor& x,
                                               const Tensor& gamma, const Tensor& beta, const Tensor& mean,
                                               const Tensor& variance, Activation activation,
                                               const Tensor& y) override;
  void batch_norm_activation_backward(const PlanState* plan, const BatchNormGeometry& g, const Tensor& x,
                                      const Tensor& y, const Tensor& gamma, const Tensor& beta, const Tensor& dy,
                                      const Tensor& batch_mean,
                                      const Tensor& batch_variance, Activation activation, const Tensor& dx,
                                      const Tensor& dgamma, const Tensor& dbeta) override;

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

 private:
  Device device_;
  std::unique_ptr<Allocator> allocator_;
  std::atomic<std::uint64_t> copies_to_host_{0};
};

}  // namespace cohort::cpu
