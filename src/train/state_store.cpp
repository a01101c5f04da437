#include "cohort/train/state_store.hpp"

#include <array>
#include <string>
#include <vector>

#include "core/sealed_file.hpp"
#include "train/optimizer_shards.hpp"

namespace cohort::train {

std::optional<TrainingPosition> StateStore::restore(const std::filesystem::path& directory, nn::Sequential& model,
                                                    optim::Optimizer& optimizer) {
  const auto path = directory / kCheckpointFile;
  if (!sealed_file_exists(path)) return std::nullopt;
  return load_checkpoint(path, model, optimizer);
}

void WholeModelState::save(const std::filesystem::path& directory, const nn::Sequential& model,
                           const optim::Optimizer& optimizer, const TrainingPosition& position) {
  if (writes_) save_checkpoint(directory / kCheckpointFile, model, optimizer, position);
}

void ShardedState::save(const std::filesystem::path& directory, const nn::Sequential& model, const optim::Optimizer& optimizer,
                        const TrainingPosition& position) {
  const int ranks = group_.size();
  const auto shard_name = [&](int rank) { return optimizer_shard_name(position.global_step, rank, ranks); };
  write_optimizer_shard(directory / shard_name(group_.rank()), model, optimizer, synchronizer_.pieces());
  // Every shard is on disk before the checkpoint that names them replaces the last one.
  std::array<double, 1> written{1.0};
  group_.sum_over_replicas(written);
  if (!group_.is_chief()) return;
  std::vector<std::string> shards;
  for (int rank = 0; rank < ranks; ++rank) shards.push_back(shard_name(rank));
  save_checkpoint(directory / kCheckpointFile, model, optimizer, position, shards);
}

}  // namespace cohort::train
