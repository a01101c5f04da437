#include "train/parameter_server_state.hpp"

#include "cohort/core/error.hpp"
#include "core/sealed_file.hpp"
#include "train/position_codec.hpp"

namespace cohort::train {

void ParameterServerState::save(const std::filesystem::path& directory, const nn::Sequential& model,
                                const optim::Optimizer&, const TrainingPosition& position) {
  if (!replicas_.is_chief()) return;
  ps::ParameterStore& store = synchronizer_.store();
  const ps::Plan& plan = store.placement();
  const ps::Manifest manifest{.step = position.global_step,
                              .policy = plan.policy(),
                              .servers = plan.servers(),
                              .plan_fingerprint = plan.fingerprint(),
                              .files = store.save(position.global_step),
                              .trainer_state = encode_position(position, model.step())};
  ps::write_manifest(directory, manifest);  // the commit point: it names a complete set of snapshots
  ps::remove_old_snapshots(directory, position.global_step);
}

std::optional<TrainingPosition> ParameterServerState::restore(const std::filesystem::path& directory,
                                                              nn::Sequential& model, optim::Optimizer&) {
  if (!sealed_file_exists(directory / ps::kManifestName)) {
    // A complete set of snapshots without the manifest that names them: starting over would delete them at
    // the first checkpoint, so the run refuses and says how to proceed. An incomplete set is a checkpoint
    // that failed before its commit (a full disk): it holds nothing to lose, and the next one replaces it.
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(directory, error))
      if (entry.is_directory() && entry.path().filename().string().starts_with("ps-step-") &&
          ps::holds_complete_snapshots(entry.path()))
        throw DataError(fmt::format("{} holds parameter-server snapshots ({}) but no {}: refusing to start over and "
                                    "delete them; restore the manifest to resume, or remove the directory to start afresh",
                                    directory.string(), entry.path().filename().string(), ps::kManifestName));
    return std::nullopt;
  }
  resumed_from_ = ps::read_manifest(directory);
  resumed_dir_ = directory;
  auto [position, model_step] = decode_position(resumed_from_->trainer_state);
  model.set_step(model_step);
  return position;
}

std::vector<ps::ServerSnapshot> ParameterServerState::snapshots() const {
  return resumed_from_ ? ps::read_snapshots(resumed_dir_, *resumed_from_) : std::vector<ps::ServerSnapshot>{};
}

}  // namespace cohort::train
