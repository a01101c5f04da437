#include "cohort/train/bucketed_allreduce.hpp"

#include <chrono>

#include "cohort/core/check.hpp"
#include "cohort/core/timeline.hpp"
#include "cohort/tensor/ops.hpp"
#include "cohort/train/update.hpp"

namespace cohort::train {
namespace {

// The sums a codec asks for, counted.
class CountedReduction final : public ReplicaReduction {
 public:
  CountedReduction(ReplicaReduction& inner, double& bytes) : inner_(inner), bytes_(bytes) {}
  int replicas() const override { return inner_.replicas(); }
  void sum(const Tensor& values) override {
    bytes_ += static_cast<double>(values.bytes());
    inner_.sum(values);
  }

 private:
  ReplicaReduction& inner_;
  double& bytes_;
};

}  // namespace

BucketedAllreduce::BucketedAllreduce(ProcessGroup& group, BucketedAllreduceOptions options)
    : BucketedSynchronizer(group, options.buckets, 1, options.gradient_dtype != DType::Float32 || options.codec),
      options_(std::move(options)) {
  COHORT_CHECK(!options_.codec || options_.gradient_dtype == DType::Float32,
               "the gradient codec {} takes float32 gradients; drop --gradient-dtype", options_.codec ? options_.codec->name() : "");
}

std::string BucketedAllreduce::name_for(const std::string& communicator, const std::optional<GradientCodec>& codec) {
  const std::string allreduce = communicator.ends_with("ring") ? communicator + "-allreduce" : "allreduce over " + communicator;
  return codec ? fmt::format("{} ({})", allreduce, codec->name()) : allreduce;
}

comm::WorkPtr BucketedAllreduce::start_bucket(const Tensor& values, const Tensor& staging) {
  if (options_.codec) return nullptr;  // reduced after backward (reduce_through_codec)
  return group_.start(ProcessGroup::Collective::Allreduce, values, staging, options_.gradient_dtype);
}

void BucketedAllreduce::update(nn::Sequential& model, optim::Optimizer& optimizer, LossScale* loss_scale) {
  // Through a codec only the sample count went through the staging buffer.
  const double global_samples = wait_for_buckets(options_.codec ? buckets_.elements() : 0);
  if (options_.codec) reduce_through_codec();
  else count_reduced(options_.gradient_dtype);
  ops::scale(gradient_values(), 1.0f / static_cast<float>(global_samples));
  update_variables(optimizer, model.trainable_variables(), loss_scale);
}

void BucketedAllreduce::reduce_through_codec() {
  const timeline::Span span("communication", fmt::format("gradients through {}", options_.codec->name()));
  const auto started = std::chrono::steady_clock::now();
  CountedReduction counted(group_, traffic_.reduced_bytes);
  for (const GradientBucket& bucket : buckets_.buckets()) {
    std::vector<BucketGradient> gradients;
    for (std::size_t member : bucket.members) {
      const auto& v = buckets_.variables()[member];
      gradients.push_back({v->name, v->gradient});
    }
    options_.codec->reduce(gradients, counted);
  }
  add_exposed(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
}

}  // namespace cohort::train
