#include "cohort/train/strategy.hpp"

#include "cohort/core/check.hpp"
#include "cohort/train/update.hpp"

namespace cohort::train {

void LocalUpdate::finish(nn::Sequential& model, optim::Optimizer& optimizer) {
  update_variables(optimizer, model.trainable_variables(), loss_scale_);
}

DataShare data_share_for(DataPolicy policy, int replica, int replicas) {
  // Each worker reading everything gets its own order, so that the workers do not march in lockstep.
  if (policy == DataPolicy::EachWorkerFullPass)
    return {.replica = 0, .replicas = 1, .seed_offset = static_cast<std::uint64_t>(replica) * 0x9E3779B97F4A7C15ull};
  return {.replica = replica, .replicas = replicas};
}

std::string Strategy::replica_name(int replica) const {
  std::string name = replica_group().process_name(replica);
  return name.empty() ? "replica " + std::to_string(replica) : name;
}

void Strategy::begin_gradients(nn::Sequential& model, std::int64_t samples) {
  step_begun_ = true;
  step_samples_ = samples;
  synchronizer().begin(model, samples);
}

void Strategy::gradients_ready(std::span<const nn::VariablePtr> variables) {
  COHORT_CHECK(step_begun_, "gradients_ready() before begin_gradients()");
  synchronizer().gradients_ready(variables);
}

void Strategy::apply_gradients(nn::Sequential& model, optim::Optimizer& optimizer, std::int64_t samples) {
  // Called without the backward announcements (a loop of the caller's own), every gradient is final.
  if (!step_begun_) begin_gradients(model, samples);
  COHORT_CHECK(samples == step_samples_, "apply_gradients() for {} samples after begin_gradients() for {}", samples, step_samples_);
  step_begun_ = false;
  synchronizer().finish(model, optimizer);
}

void Strategy::add_exposed_seconds(Logs& logs) {
  const double exposed = synchronizer().exposed_seconds();
  logs["comm_seconds"] = exposed - reported_exposed_seconds_;
  reported_exposed_seconds_ = exposed;
}

std::shared_ptr<const data::Sampler> Strategy::sampler(std::int64_t size, std::uint64_t seed, bool shuffle) const {
  if (shuffle) return std::make_shared<data::ShuffleSampler>(size, seed);
  return std::make_shared<data::SequentialSampler>(size);
}

}  // namespace cohort::train
