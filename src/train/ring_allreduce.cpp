#include "cohort/train/ring_allreduce.hpp"

#include <fmt/ranges.h>

#include <array>

#include "cohort/core/check.hpp"
#include "cohort/core/format.hpp"
#include "cohort/core/logging.hpp"
#include "cohort/core/seed.hpp"

namespace cohort::train {

RingAllreduce::RingAllreduce(comm::Transport& transport, RingAllreduceOptions options)
    : RingAllreduce(std::shared_ptr<comm::Communicator>(comm::make_ring_communicator(transport)), std::move(options)) {}

RingAllreduce::RingAllreduce(std::shared_ptr<comm::Communicator> communicator, RingAllreduceOptions options)
    : RingAllreduce(std::vector{std::move(communicator)}, std::move(options)) {}

RingAllreduce::RingAllreduce(std::vector<std::shared_ptr<comm::Communicator>> communicators, RingAllreduceOptions options)
    : Strategy(options.data), options_(std::move(options)), group_(std::make_shared<ProcessGroup>(std::move(communicators))) {
  COHORT_CHECK(options_.zero_stage >= 0 && options_.zero_stage <= 2, "ZeRO stage {}: there are stages 0, 1 and 2",
               options_.zero_stage);
  COHORT_CHECK(!options_.codec || (options_.zero_stage == 0 && options_.gradient_dtype == DType::Float32),
               "the gradient codec {} takes float32 gradients without sharding; drop --shard-optimizer or --gradient-dtype",
               options_.codec ? options_.codec->name() : "");
  const BucketSizes buckets{.first_bucket_bytes = options_.first_bucket_bytes, .bucket_bytes = options_.bucket_bytes};
  if (sharded()) {
    auto sharded = std::make_unique<ShardedAllreduce>(
        *group_, ShardedAllreduceOptions{.buckets = buckets, .stage = options_.zero_stage, .gradient_dtype = options_.gradient_dtype});
    state_store_ = std::make_unique<ShardedState>(*group_, *sharded);
    synchronizer_ = std::move(sharded);
  } else {
    synchronizer_ = std::make_unique<BucketedAllreduce>(
        *group_, BucketedAllreduceOptions{.buckets = buckets, .gradient_dtype = options_.gradient_dtype, .codec = options_.codec});
    state_store_ = std::make_unique<WholeModelState>(group_->is_chief());
  }
}

RingAllreduce::~RingAllreduce() = default;

void RingAllreduce::check_replicas_agree() {
  // The codec by a 53-bit hash of its name, which a double holds exactly.
  const double codec = options_.codec ? static_cast<double>(derive_seed(0, options_.codec->name()) >> 11) : 0.0;
  const std::array<double, 4> plan{static_cast<double>(options_.gradient_dtype), static_cast<double>(options_.zero_stage), codec, 1.0};
  std::array<double, 4> sums = plan;
  group_->sum_over_replicas(sums);
  const auto disagree = [&](std::size_t i) { return sums[i] != plan[i] * sums[3]; };
  if (disagree(0))
    throw InvalidArgument(fmt::format("the replicas disagree on what gradients travel as: this one sends {}; give every "
                                      "process the same --gradient-dtype",
                                      dtype_name(options_.gradient_dtype)));
  if (disagree(1))
    throw InvalidArgument(fmt::format("the replicas disagree on sharding the optimizer: this one runs zero stage {}; give "
                                      "every process the same --shard-optimizer",
                                      options_.zero_stage));
  if (disagree(2))
    throw InvalidArgument(fmt::format("the replicas disagree on the gradient codec: this one runs {}; give every process the "
                                      "same --gradient-codec",
                                      options_.codec ? options_.codec->name() : "none"));
}

void RingAllreduce::initialize(nn::Sequential& model, optim::Optimizer&) {
  group_->prefer_gpu_communicator(model.device(), options_.gradient_dtype);
  check_replicas_agree();
  if (options_.gradient_dtype != DType::Float32 && is_chief())
    log::info("gradients travel as {}: half the bytes of float32, summed in float32", dtype_name(options_.gradient_dtype));
  synchronizer_->prepare(model);
  // Every variable, trainable or not, starts from the chief's value.
  std::uint64_t largest = static_cast<std::uint64_t>(model.replica_sum_elements()) * sizeof(float);
  for (const auto& v : model.variables()) largest = std::max(largest, static_cast<std::uint64_t>(v->value.numel()) * sizeof(float));
  group_->expect_buffers_up_to(largest);
  group_->broadcast_from_chief(model.variables());
  // A resumed run's optimizer holds the whole state.
  synchronizer_->optimizer_state_replaced();
}

void RingAllreduce::finish(const History&, const optim::Optimizer& optimizer) {
  optimizer_state_bytes_ = optimizer.state_bytes();
  optimizer_state_bytes_per_rank_.assign(static_cast<std::size_t>(replicas()), 0.0);
  optimizer_state_bytes_per_rank_[static_cast<std::size_t>(process_index())] = static_cast<double>(optimizer_state_bytes_);
  group_->sum_over_replicas(optimizer_state_bytes_per_rank_);
}

std::string RingAllreduce::final_report() {
  std::string report;
  const GradientTraffic traffic = gradient_traffic();
  if (traffic.gradient_bytes > 0) {
    const std::string how = options_.codec ? options_.codec->name() : std::string(dtype_name(options_.gradient_dtype));
    report = fmt::format("gradients: {} over the run, {} of it reduced over the replicas ({}: {:.1f}x fewer bytes)\n",
                         mebibytes(traffic.gradient_bytes), mebibytes(traffic.reduced_bytes), how,
                         traffic.gradient_bytes / std::max(traffic.reduced_bytes, 1.0));
  }
  if (optimizer_state_bytes_per_rank_.empty()) return report;
  std::vector<std::string> ranks;
  double total = 0;
  for (std::size_t r = 0; r < optimizer_state_bytes_per_rank_.size(); ++r) {
    ranks.push_back(fmt::format("{} {}", replica_name(static_cast<int>(r)), mebibytes(optimizer_state_bytes_per_rank_[r])));
    total += optimizer_state_bytes_per_rank_[r];
  }
  return report + fmt::format("optimizer state per rank ({}): {}; {} in all\n",
                              sharded() ? fmt::format("zero{}", options_.zero_stage) : "not sharded", fmt::join(ranks, ", "),
                              mebibytes(total));
}

}  // namespace cohort::train
