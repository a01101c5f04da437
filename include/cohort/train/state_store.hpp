#pragma once
// State stores: where a training run's state goes at a checkpoint, and where a resumed run finds it.
// - WholeModelState: one process (the chief) writes directory/latest.ckpt, the variables, the optimizer's
//   state and the position (checkpoint.hpp); every process reads it.
// - ShardedState: each rank of a sharded update (ShardedAllreduce) writes the optimizer state of its
//   pieces to a shard file of its own, then the chief writes the checkpoint naming every shard, once all
//   are on disk. Reading assembles the whole state, so a run resumes on any process count, sharded or not.
// Parameter servers have a store of their own (ParameterServer's): each server writes its snapshot, then
// the chief the manifest naming them (ps/snapshot.hpp).
//
//   train::WholeModelState store(/*writes=*/group.is_chief());
//   store.save("run", model, optimizer, position);
//   auto position = store.restore("run", model, optimizer);  // nullopt: no checkpoint there

#include <filesystem>
#include <optional>

#include "cohort/nn/sequential.hpp"
#include "cohort/optim/optimizer.hpp"
#include "cohort/train/checkpoint.hpp"
#include "cohort/train/process_group.hpp"
#include "cohort/train/sharded_allreduce.hpp"

namespace cohort::train {

class StateStore {
 public:
  virtual ~StateStore() = default;
  // Every process of the run calls it at the same point.
  virtual void save(const std::filesystem::path& directory, const nn::Sequential& model, const optim::Optimizer& optimizer,
                    const TrainingPosition& position) = 0;
  // The state in `directory` restored into `model` and `optimizer`, whichever of these stores wrote it;
  // nullopt where there is none. DataError for a damaged or foreign checkpoint or shard, naming the file.
  virtual std::optional<TrainingPosition> restore(const std::filesystem::path& directory, nn::Sequential& model,
                                                  optim::Optimizer& optimizer);
};

class WholeModelState final : public StateStore {
 public:
  // `writes`: whether this process writes the checkpoint (the chief's).
  explicit WholeModelState(bool writes) : writes_(writes) {}
  void save(const std::filesystem::path& directory, const nn::Sequential& model, const optim::Optimizer& optimizer,
            const TrainingPosition& position) override;

 private:
  bool writes_;
};

class ShardedState final : public StateStore {
 public:
  // Both must outlive the store.
  ShardedState(ProcessGroup& group, const ShardedAllreduce& synchronizer) : group_(group), synchronizer_(synchronizer) {}
  void save(const std::filesystem::path& directory, const nn::Sequential& model, const optim::Optimizer& optimizer,
            const TrainingPosition& position) override;

 private:
  ProcessGroup& group_;
  const ShardedAllreduce& synchronizer_;
};

}  // namespace cohort::train
