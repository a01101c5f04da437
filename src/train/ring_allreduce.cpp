#include "cohort/train/ring_allreduce.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <utility>

#include "cohort/comm/nccl.hpp"
#include "cohort/core/check.hpp"
#include "cohort/core/logging.hpp"
#include "cohort/core/seed.hpp"
#include "cohort/core/timeline.hpp"
#include "cohort/tensor/devices.hpp"
#include "cohort/tensor/ops.hpp"
#include "cohort/train/update.hpp"

namespace cohort::train {

RingAllreduce::RingAllreduce(comm::Transport& transport, RingAllreduceOptions options)
    : RingAllreduce(std::shared_ptr<comm::Communicator>(comm::make_ring_communicator(transport)), options) {}

RingAllreduce::RingAllreduce(std::shared_ptr<comm::Communicator> communicator, RingAllreduceOptions options)
    : RingAllreduce(std::vector{std::move(communicator)}, options) {}

RingAllreduce::RingAllreduce(std::vector<std::shared_ptr<comm::Communicator>> communicators, RingAllreduceOptions options)
    : options_(options), communicators_(std::move(communicators)) {
  COHORT_CHECK(!communicators_.empty(), "RingAllreduce needs a communicator");
  for (const auto& c : communicators_) {
    COHORT_CHECK(c != nullptr, "RingAllreduce got a null communicator");
    COHORT_CHECK(c->rank() == communicators_[0]->rank() && c->size() == communicators_[0]->size(),
                 "communicators '{}' (rank {} of {}) and '{}' (rank {} of {}) span different groups", c->name(),
                 c->rank(), c->size(), communicators_[0]->name(), communicators_[0]->rank(), communicators_[0]->size());
  }
}

std::string RingAllreduce::name() const {
  const std::string& first = communicators_.front()->name();
  if (sharded()) return fmt::format("zero{} over {}", options_.zero_stage, first);
  const std::string allreduce = first.ends_with("ring") ? first + "-allreduce" : "allreduce over " + first;
  return options_.codec ? fmt::format("{} ({})", allreduce, options_.codec->name()) : allreduce;
}

std::pair<comm::Communicator*, bool> RingAllreduce::communicator_for(Device device) const {
  for (const auto& c : communicators_)
    if (c->accepts(device)) return {c.get(), true};
  return {communicators_.front().get(), false};
}

comm::WorkPtr RingAllreduce::start_collective(const Tensor& buffer, const Tensor& staging, Collective collective, DType wire) {
  const auto [communicator, direct] = communicator_for(buffer.device());
  if (direct) {
    // A communicator with a stream of its own reads the buffer only after the ops that wrote it.
    ops::synchronize(buffer.device());
  } else {
    ops::copy(buffer, staging);
  }
  const Tensor& exchanged = direct ? buffer : staging;
  // The buffer owns a reference to the storage: a collective still running after a failed wait writes
  // into memory that is still there.
  const comm::Buffer data{exchanged.device_pointer(), static_cast<std::size_t>(exchanged.numel()), DType::Float32,
                          exchanged.device(), std::make_shared<const Tensor>(exchanged), wire};
  switch (collective) {
    case Collective::Allreduce: return communicator->allreduce(data, comm::ReduceOp::Sum);
    case Collective::Broadcast: return communicator->broadcast(data, 0);
    case Collective::ReduceScatter: return communicator->reduce_scatter(data, comm::ReduceOp::Sum);
    case Collective::Allgather: {
      comm::Buffer mine = data;
      mine.count = data.count / static_cast<std::size_t>(communicator->size());
      mine.data = static_cast<float*>(data.data) + static_cast<std::size_t>(communicator->rank()) * mine.count;
      return communicator->allgather(mine, data);
    }
  }
  throw Error("unknown collective");
}

void RingAllreduce::add_gpu_communicator(Device device) {
  if (!comm::nccl_available()) return;
  if (options_.gradient_dtype != DType::Float32) {  // NCCL would need 16-bit buffers of their own
    if (device == Device::CUDA && is_chief())
      log::info("{} gradients travel through pinned host memory over the ring", dtype_name(options_.gradient_dtype));
    return;
  }
  comm::Communicator* host = nullptr;
  for (const auto& c : communicators_) {
    if (c->accepts(Device::CUDA)) return;  // the caller chose one
    if (host == nullptr && c->accepts(Device::CPU)) host = c.get();
  }
  if (host == nullptr) return;
  // Collective: every rank says whether and where it uses a GPU, and all reach the same verdict.
  std::string why_not;
  auto nccl = comm::make_nccl_communicator(*host, device == Device::CUDA ? cuda_device_index() : -1, why_not);
  if (nccl) {
    communicators_.insert(communicators_.begin(), std::shared_ptr<comm::Communicator>(std::move(nccl)));
    if (is_chief()) log::info("gradients travel over NCCL, from GPU to GPU");
  } else if (device == Device::CUDA && is_chief()) {
    log::info("gradients travel through pinned host memory over {}: {}", host->name(), why_not);
  }
}

void RingAllreduce::initialize(nn::Sequential& model, optim::Optimizer&) {
  COHORT_CHECK(options_.zero_stage >= 0 && options_.zero_stage <= 2, "ZeRO stage {}: there are stages 0, 1 and 2",
               options_.zero_stage);
  COHORT_CHECK(options_.zero_stage < 2 || options_.gradient_dtype == DType::Float32,
               "zero2 reduce-scatters float32 gradients; {} gradients take zero1 or no sharding", dtype_name(options_.gradient_dtype));
  COHORT_CHECK(!options_.codec || (options_.zero_stage == 0 && options_.gradient_dtype == DType::Float32),
               "the gradient codec {} takes float32 gradients without sharding; drop --shard-optimizer or --gradient-dtype",
               options_.codec ? options_.codec->name() : "");
  add_gpu_communicator(model.device());
  {
    // Replicas that send gradients as different types, or shard differently, would misread each other's buckets.
    // The codec by a 53-bit hash of its name, which a double holds exactly.
    const double codec = options_.codec ? static_cast<double>(derive_seed(0, options_.codec->name()) >> 11) : 0.0;
    std::array<double, 4> plan{static_cast<double>(options_.gradient_dtype), static_cast<double>(options_.zero_stage), codec, 1.0};
    std::array<double, 4> sums = plan;
    const bool summed = sum_over_replicas(sums);
    const auto disagree = [&](std::size_t i) { return summed && sums[i] != plan[i] * sums[3]; };
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
  if (options_.gradient_dtype != DType::Float32 && is_chief())
    log::info("gradients travel as {}: half the bytes of float32, summed in float32", dtype_name(options_.gradient_dtype));
  // Every variable, trainable or not, starts from the chief's value.
  plan_buckets(model);
  const auto timeout = communicators_.front()->timeout();
  Tensor staging;
  for (const auto& v : model.variables()) {
    const std::int64_t n = v->value.numel();
    const Tensor value = v->value.view({n});
    if (staged_ && (!staging.defined() || staging.numel() < n)) staging = Tensor::pinned({n});
    const Tensor staged_value = staged_ ? staging.slice(0, n) : Tensor();
    start_collective(value, staged_value, Collective::Broadcast, DType::Float32)->wait(timeout);
    if (staged_) ops::copy(staged_value, value);
  }
  state_cut_to_pieces_ = false;  // a resumed run's optimizer holds the whole state
}

void RingAllreduce::plan_buckets(const nn::Sequential& model) {
  buckets_ = GradientBuckets(model.trainable_variables(), options_.first_bucket_bytes, options_.bucket_bytes,
                             sharded() ? communicators_.front()->size() : 1);
  plan_pieces();
  bucket_states_.assign(buckets_.buckets().size(), {});
  fused_ = Tensor({buckets_.elements() + 1}, model.device());
  staged_ = !communicator_for(model.device()).second;
  staging_ = staged_ ? Tensor::pinned({fused_.numel()}) : Tensor();
  statistics_variables_.clear();
  std::int64_t statistics_elements = 0;
  if (communicators_.front()->size() > 1)
    for (const auto& v : model.variables())
      if (!v->trainable) {
        statistics_variables_.push_back(v);
        statistics_elements += v->value.numel();
      }
  statistics_ = statistics_elements > 0 ? Tensor({statistics_elements}, model.device()) : Tensor();
  statistics_staging_ = staged_ && statistics_elements > 0 ? Tensor::pinned({statistics_elements}) : Tensor();
  // The largest buffer: a bucket (the last with the sample count) or a variable the chief broadcasts.
  std::uint64_t largest = 0;
  for (const auto& bucket : buckets_.buckets())
    largest = std::max(largest, static_cast<std::uint64_t>(bucket.end - bucket.begin + 1) * sizeof(float));
  for (const auto& v : model.variables()) largest = std::max(largest, static_cast<std::uint64_t>(v->value.numel()) * sizeof(float));
  largest = std::max(largest, static_cast<std::uint64_t>(std::max(statistics_elements, model.replica_sum_elements())) * sizeof(float));
  for (const auto& c : communicators_) c->expect_buffers_up_to(largest);
}

std::vector<std::vector<std::string>> RingAllreduce::bucket_plan() const {
  std::vector<std::vector<std::string>> plan;
  for (const auto& bucket : buckets_.buckets()) {
    plan.emplace_back();
    for (std::size_t member : bucket.members) plan.back().push_back(buckets_.variables()[member]->name);
  }
  return plan;
}

void RingAllreduce::begin_gradients(nn::Sequential& model, std::int64_t samples) {
  if (fused_.device() != model.device() || buckets_.variables().size() != model.trainable_variables().size())
    plan_buckets(model);
  for (std::size_t b = 0; b < bucket_states_.size(); ++b)
    bucket_states_[b] = {.waiting = buckets_.buckets()[b].members.size(), .work = nullptr, .count_work = nullptr};
  announced_.assign(buckets_.variables().size(), false);
  next_bucket_ = 0;
  step_begun_ = true;
  // Each process's mean gradients times its sample count, summed, over the summed counts: the gradient
  // of the mean loss over the whole global batch, however unevenly it was shared. The count rides at the
  // end of the last bucket.
  step_samples_ = static_cast<float>(samples);
  ops::fill(fused_.slice(buckets_.elements(), buckets_.elements() + 1), step_samples_);
  // The last forward pass of the step has moved the statistics: their sum travels while backward runs.
  start_statistics();
  start_ready_buckets();
}

void RingAllreduce::start_statistics() {
  if (statistics_variables_.empty()) return;
  std::int64_t offset = 0;
  for (const auto& v : statistics_variables_) {
    const std::int64_t n = v->value.numel();
    ops::copy(v->value.view({n}), statistics_.slice(offset, offset + n));
    offset += n;
  }
  statistics_work_ = start_collective(statistics_, statistics_staging_, Collective::Allreduce, DType::Float32);
}

void RingAllreduce::finish_statistics() {
  if (statistics_variables_.empty()) return;
  if (staged_) ops::copy(statistics_staging_, statistics_);
  ops::scale(statistics_, 1.0f / static_cast<float>(communicators_.front()->size()));
  std::int64_t offset = 0;
  for (const auto& v : statistics_variables_) {
    const std::int64_t n = v->value.numel();
    ops::copy(statistics_.slice(offset, offset + n), v->value.view({n}));
    offset += n;
  }
}

void RingAllreduce::gradients_ready(std::span<const nn::VariablePtr> variables) {
  COHORT_CHECK(step_begun_, "gradients_ready() before begin_gradients()");
  for (const auto& v : variables) {
    const auto slot = buckets_.slot_of(*v);
    COHORT_CHECK(!announced_[slot.index], "the gradient of '{}' was announced twice in one step", v->name);
    announced_[slot.index] = true;
    const std::int64_t n = v->gradient.numel();
    const Tensor packed = fused_.slice(slot.offset, slot.offset + n);
    ops::copy(v->gradient.view({n}), packed);
    ops::scale(packed, step_samples_);
    --bucket_states_[slot.bucket].waiting;
  }
  start_ready_buckets();
}

void RingAllreduce::start_ready_buckets() {
  const auto& buckets = buckets_.buckets();
  const DType wire = options_.gradient_dtype;
  while (next_bucket_ < buckets.size() && bucket_states_[next_bucket_].waiting == 0) {
    const bool last = next_bucket_ + 1 == buckets.size();
    // The sample count must stay exact: under a bfloat16 wire it travels in float32, by itself; and every
    // rank needs it, which a reduce-scatter would bring to one.
    const bool count_apart = last && (wire != DType::Float32 || sharded() || options_.codec);
    const std::int64_t begin = buckets[next_bucket_].begin, end = buckets[next_bucket_].end + (last && !count_apart ? 1 : 0);
    BucketState& state = bucket_states_[next_bucket_];
    const Collective reduction = options_.zero_stage == 2 ? Collective::ReduceScatter : Collective::Allreduce;
    // Through a codec, the buckets are reduced after backward (reduce_through_codec).
    if (!options_.codec && (end > begin || !sharded()))
      state.work = start_collective(fused_.slice(begin, end), staged_ ? staging_.slice(begin, end) : Tensor(), reduction, wire);
    if (count_apart) {
      const std::int64_t count = buckets_.elements();
      state.count_work = start_collective(fused_.slice(count, count + 1), staged_ ? staging_.slice(count, count + 1) : Tensor(),
                                          Collective::Allreduce, DType::Float32);
    }
    ++next_bucket_;
  }
}

void RingAllreduce::apply_gradients(nn::Sequential& model, optim::Optimizer& optimizer, std::int64_t samples) {
  if (!step_begun_) {
    // Called without the backward announcements (a loop of the caller's own): every gradient is final.
    begin_gradients(model, samples);
    gradients_ready(buckets_.variables());
  }
  COHORT_CHECK(static_cast<float>(samples) == step_samples_,
               "apply_gradients() for {} samples after begin_gradients() for {}", samples, step_samples_);
  COHORT_CHECK(next_bucket_ == bucket_states_.size(), "apply_gradients() before every gradient was announced ({} of {} buckets complete)",
               next_bucket_, bucket_states_.size());
  step_begun_ = false;
  const auto timeout = communicators_.front()->timeout();
  {
    // What of the communication backward did not hide.
    const timeline::Span span("communication", "wait for allreduce");
    const auto waited_from = std::chrono::steady_clock::now();
    if (statistics_work_) std::exchange(statistics_work_, nullptr)->wait(timeout);
    for (const BucketState& state : bucket_states_) {
      if (state.work) state.work->wait(timeout);
      if (state.count_work) state.count_work->wait(timeout);
    }
    exposed_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - waited_from).count();
  }
  if (staged_) {
    // Through a codec only the sample count went through the staging buffer.
    const std::int64_t from = options_.codec ? buckets_.elements() : 0;
    ops::copy(staging_.slice(from, staging_.numel()), fused_.slice(from, fused_.numel()));
  }
  finish_statistics();
  const double global_samples = ops::sum(fused_.slice(buckets_.elements(), buckets_.elements() + 1));
  COHORT_CHECK(global_samples > 0, "a step in which no process had any data");
  const float inverse = 1.0f / static_cast<float>(global_samples);
  if (options_.codec) reduce_through_codec();
  gradient_bytes_ += static_cast<double>(buckets_.elements()) * sizeof(float);
  if (!options_.codec) wire_bytes_ += static_cast<double>(buckets_.elements()) * static_cast<double>(element_size(options_.gradient_dtype));
  if (sharded()) {
    update_pieces(model, optimizer, inverse);
    return;
  }
  for (const auto& v : buckets_.variables()) {
    const std::int64_t n = v->gradient.numel(), offset = buckets_.slot_of(*v).offset;
    ops::copy(fused_.slice(offset, offset + n), v->gradient.view({n}));
    ops::scale(v->gradient, inverse);
  }
  update_variables(optimizer, model.trainable_variables(), loss_scale_);
  optimizer_state_bytes_ = optimizer.state_bytes();
}

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

void RingAllreduce::reduce_through_codec() {
  const timeline::Span span("communication", fmt::format("gradients through {}", options_.codec->name()));
  const auto started = std::chrono::steady_clock::now();
  CountedReduction counted(*this, wire_bytes_);
  for (const GradientBucket& bucket : buckets_.buckets()) {
    std::vector<BucketGradient> gradients;
    for (std::size_t member : bucket.members) {
      const auto& v = buckets_.variables()[member];
      const std::int64_t offset = buckets_.slot_of(*v).offset;
      gradients.push_back({v->name, fused_.slice(offset, offset + v->gradient.numel()).view(v->gradient.shape())});
    }
    options_.codec->reduce(gradients, counted);
  }
  exposed_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

void RingAllreduce::sum(const Tensor& values) {
  const std::int64_t n = values.numel();
  if (staged_ && (!replica_sum_staging_.defined() || replica_sum_staging_.numel() < n)) replica_sum_staging_ = Tensor::pinned({n});
  const Tensor staged = staged_ ? replica_sum_staging_.slice(0, n) : Tensor();
  start_collective(values.view({n}), staged, Collective::Allreduce, DType::Float32)->wait(communicators_.front()->timeout());
  if (staged_) ops::copy(staged, values.view({n}));
}

void RingAllreduce::add_epoch_logs(Logs& logs) {
  logs["comm_seconds"] = exposed_seconds_ - reported_exposed_seconds_;
  reported_exposed_seconds_ = exposed_seconds_;
}

bool RingAllreduce::sum_over_replicas(std::span<double> values) {
  const auto host = std::find_if(communicators_.begin(), communicators_.end(),
                                 [](const auto& c) { return c->accepts(Device::CPU); });
  COHORT_CHECK(host != communicators_.end(), "none of the communicators takes host memory");
  comm::Communicator& communicator = **host;
  // Gathered as raw bytes (a double is two float slots) and added in rank order: exact, and the same
  // on every rank, which a float reduction would be neither.
  const auto ranks = static_cast<std::size_t>(communicator.size());
  auto mine = std::make_shared<std::vector<double>>(values.begin(), values.end());
  auto all = std::make_shared<std::vector<double>>(values.size() * ranks);
  const std::size_t slots = values.size() * sizeof(double) / sizeof(float);
  const comm::Buffer mine_buffer{mine->data(), slots, DType::Float32, Device::CPU, mine};
  const comm::Buffer all_buffer{all->data(), slots * ranks, DType::Float32, Device::CPU, all};
  communicator.allgather(mine_buffer, all_buffer)->wait(communicator.timeout());
  for (std::size_t i = 0; i < values.size(); ++i) {
    double sum = 0;
    for (std::size_t r = 0; r < ranks; ++r) sum += (*all)[r * values.size() + i];
    values[i] = sum;
  }
  return true;
}

DataShare RingAllreduce::data_share() const {
  return data_share_for(options_.data, communicators_.front()->rank(), communicators_.front()->size());
}

}  // namespace cohort::train
