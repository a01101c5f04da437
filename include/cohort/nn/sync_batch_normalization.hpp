#pragma once
// SyncBatchNormalization, as keras.layers.SyncBatchNormalization (Horovod's hvd.SyncBatchNormalization):
// a BatchNormalization whose training statistics are those of the global batch, every replica's samples
// together, so that W replicas at batch B normalize, move their statistics and back-propagate exactly as
// one process at batch W x B does. Each training pass sums per-channel moments over the replicas once
// forward and once backward (the model's nn::ReplicaSum); with none (one process) it is BatchNormalization.
// Inference and model files are BatchNormalization's; variables and their names the same.
//
//   model.add(nn::Conv2D(32, 3, nn::Padding::Same)).add(nn::SyncBatchNormalization()).add(nn::ReLU());

#include "cohort/nn/batch_normalization.hpp"

namespace cohort::nn {

class SyncBatchNormalization : public BatchNormalization {
 public:
  using BatchNormalization::BatchNormalization;

  std::string type_name() const override { return "SyncBatchNormalization"; }
  std::string name_stem() const override { return "sync_batch_normalization"; }
  Tensor forward(const Tensor& x, const ForwardContext& context) override;
  Tensor backward(const Tensor& dy, bool need_input_gradient) override;
  std::size_t absorb(std::span<const std::unique_ptr<Layer>> following, const ForwardContext& context) override;
  std::int64_t replica_sum_elements() const override;
  void forward_without_batch(const ForwardContext& context) override;
  void backward_without_batch() override;

 private:
  void prepare_buffers(Device device);
  // The global batch's mean and variance from the summed moments [sum | sum of squares | count], into
  // batch_mean_ and batch_variance_, and the moving statistics moved by them.
  void adopt_global_statistics();
  std::int64_t channels() const { return gamma_->value.numel(); }

  ReplicaSum* replica_sum_ = nullptr;  // of the last training forward(); null: local statistics
  Tensor moments_, gradient_sums_, squares_, scale_, shift_, correction_;
  double global_rows_ = 0;  // values per channel in the global batch
  double local_rows_ = 0;
};

}  // namespace cohort::nn
