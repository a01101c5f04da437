#include "cohort/train/strategy.hpp"

#include "cohort/core/error.hpp"
#include "cohort/train/state_store.hpp"
#include "cohort/train/update.hpp"

namespace cohort::train {

void Local::apply_gradients(nn::Sequential& model, optim::Optimizer& optimizer, std::int64_t) {
  update_variables(optimizer, model.trainable_variables(), loss_scale_);
}

DataShare data_share_for(DataPolicy policy, int replica, int replicas) {
  // Each worker reading everything gets its own order, so that the workers do not march in lockstep.
  if (policy == DataPolicy::EachWorkerFullPass)
    return {.replica = 0, .replicas = 1, .seed_offset = static_cast<std::uint64_t>(replica) * 0x9E3779B97F4A7C15ull};
  return {.replica = replica, .replicas = replicas};
}

History Strategy::serve(nn::Sequential&, optim::Optimizer&, const std::filesystem::path&) {
  throw Error(fmt::format("strategy '{}' has no server processes", name()));
}

void Strategy::save_checkpoint(const std::filesystem::path& directory, const nn::Sequential& model,
                               const optim::Optimizer& optimizer, const TrainingPosition& position) {
  WholeModelState(is_chief()).save(directory, model, optimizer, position);
}

std::optional<TrainingPosition> Strategy::restore_checkpoint(const std::filesystem::path& directory, nn::Sequential& model,
                                                             optim::Optimizer& optimizer) {
  return WholeModelState(false).restore(directory, model, optimizer);
}

std::shared_ptr<const data::Sampler> Strategy::sampler(std::int64_t size, std::uint64_t seed, bool shuffle) const {
  if (shuffle) return std::make_shared<data::ShuffleSampler>(size, seed);
  return std::make_shared<data::SequentialSampler>(size);
}

}  // namespace cohort::train
