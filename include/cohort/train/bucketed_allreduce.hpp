#pragma once
// BucketedAllreduce: Horovod-style gradient synchronization. Every replica sums every bucket of gradients
// over the replicas (bucketed_synchronizer.hpp), overlapped with backward, then applies the same update
// with its own optimizer. The gradients may travel as bfloat16 (half the bytes; the ring adds them in
// float32 and rounds once, alike on every replica), or through a codec (PowerSGD, or any
// GradientCodecLike type), which reduces each bucket after backward.

#include <optional>
#include <string>

#include "cohort/train/bucketed_synchronizer.hpp"
#include "cohort/train/gradient_codec.hpp"

namespace cohort::train {

struct BucketedAllreduceOptions {
  BucketSizes buckets{};
  // What the gradients travel as (comm::AllreduceOptions::wire).
  DType gradient_dtype = DType::Float32;
  // float32 gradients only.
  std::optional<GradientCodec> codec{};
};

class BucketedAllreduce final : public BucketedSynchronizer {
 public:
  // `group` must outlive the synchronizer.
  BucketedAllreduce(ProcessGroup& group, BucketedAllreduceOptions options);

  std::string name() const override { return name_for(group_.communicator_name(), options_.codec); }
  // The name of one over `communicator` with `codec`, before it is built.
  static std::string name_for(const std::string& communicator, const std::optional<GradientCodec>& codec);

 private:
  void update(nn::Sequential& model, optim::Optimizer& optimizer, LossScale* loss_scale) override;
  comm::WorkPtr start_bucket(const Tensor& values, const Tensor& staging) override;
  void reduce_through_codec();

  BucketedAllreduceOptions options_;
};

}  // namespace cohort::train
