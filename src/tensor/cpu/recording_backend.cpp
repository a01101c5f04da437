#include "recording_backend.hpp"

#include <fmt/format.h>

#include <utility>

#include "cohort/core/error.hpp"

namespace cohort::cpu {
namespace {

// The calls of one capture; a launch while some thread captures is itself one call of that capture.
class Recording final : public BackendGraph {
 public:
  Recording(std::function<void(std::function<void()>)> run, std::vector<std::function<void()>> calls,
            std::shared_ptr<void> pool)
      : pool_(std::move(pool)), run_(std::move(run)), calls_(std::move(calls)) {}
  void launch() override {
    run_([this] {
      for (const auto& call : calls_) call();
    });
  }

 private:
  std::shared_ptr<void> pool_;  // released after the calls and the tensors they hold
  std::function<void(std::function<void()>)> run_;
  std::vector<std::function<void()>> calls_;
};

std::shared_ptr<const PlanState> keep(const PlanState* plan) {
  return plan == nullptr ? nullptr : plan->shared_from_this();
}

// The CPU's copies, refused to the capturing thread as a GPU's copy stream is.
class RecordingStream final : public BackendStream {
 public:
  RecordingStream(std::unique_ptr<BackendStream> copies, const CapturingThread& capturing)
      : copies_(std::move(copies)), capturing_(capturing) {}

  void enqueue_copy(const Tensor& source, const Tensor& destination) override {
    const auto active = capturing_.enter_op();
    capturing_.refuse_copy_stream("CopyStream::copy");
    copies_->enqueue_copy(source, destination);
  }
  void synchronize() override {
    const auto active = capturing_.enter_op();
    capturing_.refuse_copy_stream("CopyStream::synchronize");
    copies_->synchronize();
  }

 private:
  std::unique_ptr<BackendStream> copies_;
  const CapturingThread& capturing_;
};

}  // namespace

RecordingBackend::RecordingBackend(std::unique_ptr<CpuBackend> kernels) : kernels_(std::move(kernels)) {
  capturing_.name_device(std::string(device_name(device())));
}

void RecordingBackend::run(Call call) {
  const auto active = capturing_.enter_op();
  if (capturing_.is_this_thread()) recorded_.push_back(std::move(call));
  else call();
}

CapturingThread::OpScope RecordingBackend::refuse_while_recording(const char* op) {
  if (capturing_.is_this_thread() && refused_.empty()) refused_ = op;
  capturing_.refuse_host_wait(op);
  return capturing_.enter_op();
}

void RecordingBackend::begin_capture() {
  capturing_.claim();
  // The blocks handed out meanwhile are the recording's, as on a GPU.
  try {
    if (auto* caching = dynamic_cast<CachingAllocator*>(&kernels_->allocator())) pool_ = caching->begin_private_pool();
  } catch (...) {
    capturing_.release();
    throw;
  }
}

std::unique_ptr<BackendGraph> RecordingBackend::end_capture() {
  capturing_.check_claimed();
  std::vector<Call> calls = std::exchange(recorded_, {});
  const std::string refused = std::exchange(refused_, {});
  std::shared_ptr<void> pool = std::exchange(pool_, nullptr);
  if (pool != nullptr) static_cast<CachingAllocator&>(kernels_->allocator()).end_private_pool();
  capturing_.release();
  if (!refused.empty())
    throw DeviceError(fmt::format("the captured work called {}, which makes the host wait for the device", refused));
  return std::make_unique<Recording>([this](Call call) { run(std::move(call)); }, std::move(calls), std::move(pool));
}

std::unique_ptr<BackendStream> RecordingBackend::make_stream() {
  return std::make_unique<RecordingStream>(kernels_->make_stream(), capturing_);
}

void RecordingBackend::synchronize() {
  const auto active = refuse_while_recording("synchronize");
  kernels_->synchronize();
}

DeviceEventPtr RecordingBackend::record_event() {
  const auto active = refuse_while_recording("record_event");
  return kernels_->record_event();
}

void RecordingBackend::write_bits(const Tensor& destination, std::uint64_t bits) {
  run([=, this] { kernels_->write_bits(destination, bits); });
}

void RecordingBackend::copy_from_host(const void* source, const Tensor& destination) {
  const auto active = refuse_while_recording("copy_from_host");
  kernels_->copy_from_host(source, destination);
}

void RecordingBackend::copy_to_host(const Tensor& source, void* destination) {
  const auto active = refuse_while_recording("copy_to_host");
  kernels_->copy_to_host(source, destination);
}

DeviceEventPtr RecordingBackend::copy_to_host_async(const Tensor& source, const Tensor& destination) {
  const auto active = refuse_while_recording("copy_to_host_async");
  return kernels_->copy_to_host_async(source, destination);
}

void RecordingBackend::zero(const Tensor& x) {
  run([=, this] { kernels_->zero(x); });
}

void RecordingBackend::convert(const Tensor& source, const Tensor& destination) {
  run([=, this] { kernels_->convert(source, destination); });
}

void RecordingBackend::fill(const Tensor& x, float value) {
  run([=, this] { kernels_->fill(x, value); });
}

void RecordingBackend::copy(const Tensor& source, const Tensor& destination) {
  run([=, this] { kernels_->copy(source, destination); });
}

void RecordingBackend::axpy(float alpha, const Tensor& x, const Tensor& y) {
  run([=, this] { kernels_->axpy(alpha, x, y); });
}

void RecordingBackend::scale(const Tensor& x, float alpha) {
  run([=, this] { kernels_->scale(x, alpha); });
}

void RecordingBackend::multiply(const Tensor& a, const Tensor& b, const Tensor& out) {
  run([=, this] { kernels_->multiply(a, b, out); });
}

double RecordingBackend::sum(const Tensor& x) {
  const auto active = refuse_while_recording("sum");
  return kernels_->sum(x);
}

double RecordingBackend::sum_of_squares(const Tensor& x) {
  const auto active = refuse_while_recording("sum_of_squares");
  return kernels_->sum_of_squares(x);
}

void RecordingBackend::matmul(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, const Tensor& c,
                              float alpha, float beta) {
  run([=, this] { kernels_->matmul(a, transpose_a, b, transpose_b, c, alpha, beta); });
}

void RecordingBackend::add_bias(const Tensor& y, const Tensor& bias) {
  run([=, this] { kernels_->add_bias(y, bias); });
}

void RecordingBackend::bias_gradient(const Tensor& dy, const Tensor& dbias) {
  run([=, this] { kernels_->bias_gradient(dy, dbias); });
}

void RecordingBackend::activation_forward(Activation activation, const Tensor& x, const Tensor& y) {
  run([=, this] { kernels_->activation_forward(activation, x, y); });
}

void RecordingBackend::activation_backward(Activation activation, const Tensor& y, const Tensor& dy, const Tensor& dx) {
  run([=, this] { kernels_->activation_backward(activation, y, dy, dx); });
}

void RecordingBackend::conv2d_forward(const PlanState* plan, const Conv2dGeometry& g, const Tensor& x,
                                      const Tensor& kernel, const Tensor& bias, const Tensor& y) {
  run([=, this, kept = keep(plan)] { kernels_->conv2d_forward(kept.get(), g, x, kernel, bias, y); });
}

void RecordingBackend::conv2d_backward(const PlanState* plan, const Conv2dGeometry& g, const Tensor& x,
                                       const Tensor& kernel, const Tensor& dy, const Tensor& dx, const Tensor& dkernel,
                                       const Tensor& dbias) {
  run([=, this, kept = keep(plan)] { kernels_->conv2d_backward(kept.get(), g, x, kernel, dy, dx, dkernel, dbias); });
}

void RecordingBackend::pool2d_forward(const PlanState* plan, const Pool2dGeometry& g, const Tensor& x, const Tensor& y) {
  run([=, this, kept = keep(plan)] { kernels_->pool2d_forward(kept.get(), g, x, y); });
}

void RecordingBackend::pool2d_backward(const PlanState* plan, const Pool2dGeometry& g, const Tensor& x, const Tensor& y,
                                       const Tensor& dy, const Tensor& dx) {
  run([=, this, kept = keep(plan)] { kernels_->pool2d_backward(kept.get(), g, x, y, dy, dx); });
}

void RecordingBackend::batch_norm_forward_training(const PlanState* plan, const BatchNormGeometry& g, const Tensor& x,
                                                   const Tensor& gamma, const Tensor& beta, const Tensor& y,
                                                   const Tensor& batch_mean, const Tensor& batch_variance) {
  run([=, this, kept = keep(plan)] {
    kernels_->batch_norm_forward_training(kept.get(), g, x, gamma, beta, y, batch_mean, batch_variance);
  });
}

void RecordingBackend::batch_norm_forward_inference(const PlanState* plan, const BatchNormGeometry& g, const Tensor& x,
                                                    const Tensor& gamma, const Tensor& beta, const Tensor& mean,
                                                    const Tensor& variance, const Tensor& y) {
  run([=, this, kept = keep(plan)] {
    kernels_->batch_norm_forward_inference(kept.get(), g, x, gamma, beta, mean, variance, y);
  });
}

void RecordingBackend::batch_norm_backward(const PlanState* plan, const BatchNormGeometry& g, const Tensor& x,
                                           const Tensor& gamma, const Tensor& dy, const Tensor& batch_mean,
                                           const Tensor& batch_variance, const Tensor& dx, const Tensor& dgamma,
                                           const Tensor& dbeta) {
  run([=, this, kept = keep(plan)] {
    kernels_->batch_norm_backward(kept.get(), g, x, gamma, dy, batch_mean, batch_variance, dx, dgamma, dbeta);
  });
}

void RecordingBackend::batch_norm_backward_inference(const PlanState* plan, const BatchNormGeometry& g, const Tensor& x,
                                                     const Tensor& gamma, const Tensor& dy, const Tensor& mean,
                                                     const Tensor& variance, const Tensor& dx, const Tensor& dgamma,
                                                     const Tensor& dbeta) {
  run([=, this, kept = keep(plan)] {
    kernels_->batch_norm_backward_inference(kept.get(), g, x, gamma, dy, mean, variance, dx, dgamma, dbeta);
  });
}

void RecordingBackend::moving_average_update(const Tensor& moving, const Tensor& batch, float momentum) {
  run([=, this] { kernels_->moving_average_update(moving, batch, momentum); });
}

void RecordingBackend::dropout_mask(const Tensor& mask, float rate, std::uint64_t seed, const Tensor& step) {
  run([=, this] { kernels_->dropout_mask(mask, rate, seed, step); });
}

void RecordingBackend::expand_images(const Tensor& images, const Tensor& indices, const Tensor& draws,
                                     const Tensor& mean, const Tensor& stddev, const Tensor& out) {
  run([=, this] { kernels_->expand_images(images, indices, draws, mean, stddev, out); });
}

void RecordingBackend::conv2d_forward_activated(const PlanState* plan, const Conv2dGeometry& g, const Tensor& x,
                                                const Tensor& kernel, const Tensor& bias, Activation activation,
                                                const Tensor& y) {
  run([=, this, kept = keep(plan)] {
    kernels_->conv2d_forward_activated(kept.get(), g, x, kernel, bias, activation, y);
  });
}

void RecordingBackend::bias_activation_forward(const Tensor& y, const Tensor& bias, Activation activation) {
  run([=, this] { kernels_->bias_activation_forward(y, bias, activation); });
}

void RecordingBackend::activation_bias_backward(Activation activation, const Tensor& y, const Tensor& dy,
                                                const Tensor& dpre, const Tensor& dbias) {
  run([=, this] { kernels_->activation_bias_backward(activation, y, dy, dpre, dbias); });
}

void RecordingBackend::batch_norm_activation_forward_training(const PlanState* plan, const BatchNormGeometry& g,
                                                              const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                                              Activation activation, const Tensor& y,
                                                              const Tensor& batch_mean, const Tensor& batch_variance) {
  run([=, this, kept = keep(plan)] {
    kernels_->batch_norm_activation_forward_training(kept.get(), g, x, gamma, beta, activation, y, batch_mean,
                                                     batch_variance);
  });
}

void RecordingBackend::batch_norm_activation_forward_inference(const PlanState* plan, const BatchNormGeometry& g,
                                                               const Tensor& x, const Tensor& gamma,
                                                               const Tensor& beta, const Tensor& mean,
                                                               const Tensor& variance, Activation activation,
                                                               const Tensor& y) {
  run([=, this, kept = keep(plan)] {
    kernels_->batch_norm_activation_forward_inference(kept.get(), g, x, gamma, beta, mean, variance, activation, y);
  });
}

void RecordingBackend::batch_norm_activation_backward(const PlanState* plan, const BatchNormGeometry& g,
                                                      const Tensor& x, const Tensor& y, const Tensor& gamma,
                                                      const Tensor& beta, const Tensor& dy, const Tensor& batch_mean,
                                                      const Tensor& batch_variance, Activation activation,
                                                      const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) {
  run([=, this, kept = keep(plan)] {
    kernels_->batch_norm_activation_backward(kept.get(), g, x, y, gamma, beta, dy, batch_mean, batch_variance,
                                             activation, dx, dgamma, dbeta);
  });
}

void RecordingBackend::sgd_update(const std::vector<ops::SgdOperands>& variables, const Tensor& learning_rate,
                                  float momentum, bool nesterov, float weight_decay) {
  run([=, this] { kernels_->sgd_update(variables, learning_rate, momentum, nesterov, weight_decay); });
}

void RecordingBackend::adam_update(const std::vector<ops::AdamOperands>& variables, const Tensor& learning_rate,
                                   float beta_1, float beta_2, float epsilon, float weight_decay) {
  run([=, this] { kernels_->adam_update(variables, learning_rate, beta_1, beta_2, epsilon, weight_decay); });
}

void RecordingBackend::rmsprop_update(const std::vector<ops::RmspropOperands>& variables, const Tensor& learning_rate,
                                      float rho, float momentum, float epsilon, float weight_decay) {
  run([=, this] { kernels_->rmsprop_update(variables, learning_rate, rho, momentum, epsilon, weight_decay); });
}

void RecordingBackend::softmax_cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& dlogits,
                                             const RunningSums& sums, int slot) {
  run([=, this, sums = &sums] { kernels_->softmax_cross_entropy(logits, labels, dlogits, *sums, slot); });
}

void RecordingBackend::categorical_cross_entropy(const Tensor& probabilities, const Tensor& labels,
                                                 const Tensor& dprobabilities, const RunningSums& sums, int slot) {
  run([=, this, sums = &sums] {
    kernels_->categorical_cross_entropy(probabilities, labels, dprobabilities, *sums, slot);
  });
}

void RecordingBackend::count_correct(const Tensor& scores, const Tensor& labels, const RunningSums& sums, int slot) {
  run([=, this, sums = &sums] { kernels_->count_correct(scores, labels, *sums, slot); });
}

void RecordingBackend::count_top_k(const Tensor& scores, const Tensor& labels, int k, const RunningSums& sums,
                                   int slot) {
  run([=, this, sums = &sums] { kernels_->count_top_k(scores, labels, k, *sums, slot); });
}

void RecordingBackend::elementwise_loss(ElementwiseLoss loss, const Tensor& prediction, const Tensor& targets,
                                        const Tensor& gradient, const RunningSums& sums, int slot) {
  run([=, this, sums = &sums] { kernels_->elementwise_loss(loss, prediction, targets, gradient, *sums, slot); });
}

}  // namespace cohort::cpu
