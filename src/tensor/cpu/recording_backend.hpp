#pragma once
// The emulated device's backend: the CPU backend's kernels, with the capture a GPU has (capture.hpp), so that
// captured steps are tested where no GPU is. While a thread captures, each op it queues is kept as a call to
// make at every launch of the recording, holding its operands (tensors, plans) until the recording is gone,
// and the blocks handed out meanwhile stay the recording's (a private pool). The ops that make a GPU's host wait
// refuse, as CUDA's stream capture refuses them, and other threads' ops wait while a thread captures, as on a
// GPU they would join the recording.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cpu_backend.hpp"
#include "tensor/capturing_thread.hpp"

namespace cohort::cpu {

class RecordingBackend final : public Backend {
 public:
  explicit RecordingBackend(std::unique_ptr<CpuBackend> kernels);

  // The backend that computes (its read-back count, for tests).
  const CpuBackend& kernels() const { return *kernels_; }

  Device device() const override { return kernels_->device(); }
  Allocator& allocator() override { return kernels_->allocator(); }
  std::unique_ptr<BackendStream> make_stream() override;
  void synchronize() override;
  DeviceEventPtr record_event() override;
  void begin_capture() override;
  std::unique_ptr<BackendGraph> end_capture() override;
  void write_bits(const Tensor& destination, std::uint64_t bits) override;
  bool computes(Kernel16 kernel, DType type) const override { return kernels_->computes(kernel, type); }
  std::string kernels_for(DType type) const override { return kernels_->kernels_for(type); }
  void copy_from_host(const void* source, const Tensor& destination) override;
  void copy_to_host(const Tensor& source, void* destination) override;
  DeviceEventPtr copy_to_host_async(const Tensor& source, const Tensor& destination) override;
  void zero(const Tensor& x) override;
  void convert(const Tensor& source, const Tensor& destination) override;

  std::shared_ptr<const PlanState> plan(const Conv2dGeometry& geometry) override { return kernels_->plan(geometry); }
  std::shared_ptr<const PlanState> plan(const Pool2dGeometry& geometry) override { return kernels_->plan(geometry); }
  std::shared_ptr<const PlanState> plan(const BatchNormGeometry& geometry) override { return kernels_->plan(geometry); }

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
                                      const Tensor& batch_mean, const Tensor& batch_variance, Activation activation,
                                      const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) override;

  void sgd_update(const std::vector<ops::SgdOperands>& variables, const Tensor& learning_rate, float momentum,
                  bool nesterov, float weight_decay) override;
  void adam_update(const std::vector<ops::AdamOperands>& variables, const Tensor& learning_rate, float beta_1,
                   float beta_2, float epsilon, float weight_decay) override;
  void rmsprop_update(const std::vector<ops::RmspropOperands>& variables, const Tensor& learning_rate, float rho,
                      float momentum, float epsilon, float weight_decay) override;

  // The sums are addressed, not held: they must outlive a recording that adds to them.
  void softmax_cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& dlogits, const RunningSums& sums,
                             int slot) override;
  void categorical_cross_entropy(const Tensor& probabilities, const Tensor& labels, const Tensor& dprobabilities,
                                 const RunningSums& sums, int slot) override;
  void count_correct(const Tensor& scores, const Tensor& labels, const RunningSums& sums, int slot) override;
  void count_top_k(const Tensor& scores, const Tensor& labels, int k, const RunningSums& sums, int slot) override;
  void elementwise_loss(ElementwiseLoss loss, const Tensor& prediction, const Tensor& targets, const Tensor& gradient,
                        const RunningSums& sums, int slot) override;

 private:
  using Call = std::function<void()>;
  // Runs `call`, or keeps it where the calling thread records.
  void run(Call call);
  // A host wait: DeviceError while a thread records (remembered for end_capture() where it is the caller);
  // else the op's place (capturing_thread.hpp), held while the wait runs.
  [[nodiscard]] CapturingThread::OpScope refuse_while_recording(const char* op);

  std::unique_ptr<CpuBackend> kernels_;
  CapturingThread capturing_;
  std::vector<Call> recorded_;
  std::string refused_;  // the first op the capture could not record
  std::shared_ptr<void> pool_;  // the private pool of the capture under way
};

}  // namespace cohort::cpu
