#pragma once
// A parameter-server run's checkpoints: each server writes its own snapshot, then the chief the manifest
// that names them all with the trainer's position (ps/snapshot.hpp). A run resumes onto any number of
// servers and any placement policy: each server takes the rows its new plan gives it.

#include <filesystem>
#include <optional>

#include "cohort/ps/snapshot.hpp"
#include "cohort/train/parameter_store_synchronizer.hpp"
#include "cohort/train/replicas.hpp"
#include "cohort/train/state_store.hpp"

namespace cohort::train {

class ParameterServerState final : public StateStore {
 public:
  // Both outlive this; the chief saves through the synchronizer's store.
  ParameterServerState(const Replicas& replicas, ParameterStoreSynchronizer& synchronizer)
      : replicas_(replicas), synchronizer_(synchronizer) {}

  void save(const std::filesystem::path& directory, const nn::Sequential& model, const optim::Optimizer& optimizer,
            const TrainingPosition& position) override;
  // Reads the manifest; the servers' snapshots are read by the servers (resumed()).
  std::optional<TrainingPosition> restore(const std::filesystem::path& directory, nn::Sequential& model,
                                          optim::Optimizer& optimizer) override;

  // After a restore(): the manifest, and each server's snapshots as it names them.
  bool resumed() const { return resumed_from_.has_value(); }
  std::vector<ps::ServerSnapshot> snapshots() const;

 private:
  const Replicas& replicas_;
  ParameterStoreSynchronizer& synchronizer_;
  std::optional<ps::Manifest> resumed_from_;
  std::filesystem::path resumed_dir_;
};

}  // namespace cohort::train
