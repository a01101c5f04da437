#include "cohort/train/checkpoint.hpp"

#include <cereal/types/map.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/utility.hpp>
#include <cereal/types/vector.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "cohort/tensor/ops.hpp"
#include "cohort/train/loss_scale.hpp"
#include "core/archive_bytes.hpp"
#include "core/sealed_file.hpp"
#include "nn/named_values.hpp"
#include "tensor/tensor_archive.hpp"
#include "train/optimizer_shards.hpp"
#include "train/position_codec.hpp"

namespace cohort::train {
namespace {

constexpr std::string_view kCheckpointMagic = "COHORTCK";

// Where training stands, with the model's step counter (dropout's seed).
struct PositionRecord {
  std::uint64_t model_step = 0;
  std::int64_t epoch = 0, batch_in_epoch = 0, global_step = 0;
  std::uint64_t data_seed = 0;
  std::vector<Logs> history;
  double learning_rate_factor = 1;
  std::string gemm_path;
  std::string cpu_isa;
  float loss_scale = 0;
  std::int64_t loss_scale_finite_steps = 0;
  std::string precision;

  PositionRecord() = default;
  PositionRecord(const TrainingPosition& position, std::uint64_t step)
      : model_step(step), epoch(position.epoch), batch_in_epoch(position.batch_in_epoch),
        global_step(position.global_step), data_seed(position.data_seed), history(position.history.epochs),
        learning_rate_factor(position.learning_rate_factor), gemm_path(position.gemm_path),
        cpu_isa(position.cpu_isa), loss_scale(position.loss_scale), loss_scale_finite_steps(position.loss_scale_finite_steps),
        precision(position.precision) {}
  TrainingPosition position() const {
    return {epoch, batch_in_epoch, global_step, data_seed, History{history}, learning_rate_factor, gemm_path, cpu_isa,
            loss_scale, loss_scale_finite_steps, precision};
  }

  template <class Archive>
  void serialize(Archive& archive) {
    archive(model_step, epoch, batch_in_epoch, global_step, data_seed, history, learning_rate_factor, gemm_path, cpu_isa, loss_scale,
            loss_scale_finite_steps, precision);
  }

  // A loss scale is 0 (none) or a power of two, as halving and doubling 2^15 leave it, with fewer finite
  // steps since it changed than the growth interval: anything else is no state a run leaves.
  void check(const std::string& what) const {
    int exponent = 0;
    const bool power_of_two = std::isfinite(loss_scale) && loss_scale > 0 && std::frexp(loss_scale, &exponent) == 0.5f;
    const bool none = loss_scale == 0 && loss_scale_finite_steps == 0;
    COHORT_CHECK_AS(DataError,
                    none || (power_of_two && loss_scale_finite_steps >= 0 && loss_scale_finite_steps < LossScale::kGrowthInterval),
                    "{}: a loss scale of {} after {} finite steps is not one training leaves", what, loss_scale,
                    loss_scale_finite_steps);
  }
};

struct Payload {
  nn::NamedValues variables;
  std::string optimizer_state;
  PositionRecord position;
  std::vector<std::string> optimizer_shards;  // where the optimizer's slots are, when not in optimizer_state

  template <class Archive>
  void serialize(Archive& archive) {
    archive(variables, optimizer_state, position, optimizer_shards);
  }
};

}  // namespace

void save_checkpoint(const std::filesystem::path& path, const nn::Sequential& model, const optim::Optimizer& optimizer,
                     const TrainingPosition& position, const std::vector<std::string>& optimizer_shards) {
  Payload payload;
  payload.variables = nn::named_values(model);
  payload.optimizer_shards = optimizer_shards;
  std::ostringstream optimizer_state;
  optimizer.save_state(optimizer_state, /*with_slots=*/optimizer_shards.empty());
  payload.optimizer_state = optimizer_state.str();
  payload.position = PositionRecord(position, model.step());
  write_sealed_file(path, kCheckpointMagic, kCheckpointFormatVersion, to_archive_bytes(payload));
  // Once this checkpoint is in place, the shards of earlier ones are not needed (nor read) again.
  remove_optimizer_shards_except(path.parent_path(), optimizer_shards);
}

TrainingPosition load_checkpoint(const std::filesystem::path& path, nn::Sequential& model, optim::Optimizer& optimizer) {
  const std::string name = path.string();
  const auto payload = from_archive_bytes<DataError, Payload>(
      read_sealed_file(path, kCheckpointMagic, kCheckpointFormatVersion, "checkpoint"),
      fmt::format("checkpoint {}: payload", name));

  // Check everything before changing anything.
  const std::string what = fmt::format("checkpoint {}", name);
  payload.position.check(what);
  nn::check_named_values(model, payload.variables, what);
  std::vector<std::filesystem::path> shard_paths;
  for (const std::string& shard : payload.optimizer_shards) {
    COHORT_CHECK_AS(DataError, !shard.empty() && std::filesystem::path(shard).filename() == shard,
                    "{}: an optimizer shard named '{}' is not a file beside it", what, shard);
    shard_paths.push_back(path.parent_path() / shard);
  }
  const auto sharded_slots = read_optimizer_shards(shard_paths, model, optimizer);
  std::istringstream optimizer_state(payload.optimizer_state);
  optimizer.load_state(optimizer_state);
  for (const auto& [variable, slots] : sharded_slots) optimizer.set_slots(variable, slots);
  optimizer.to(model.device());
  nn::assign_named_values(model, payload.variables, what);
  model.set_step(payload.position.model_step);
  return payload.position.position();
}

std::string encode_position(const TrainingPosition& position, std::uint64_t model_step) {
  return to_archive_bytes(PositionRecord(position, model_step));
}

std::pair<TrainingPosition, std::uint64_t> decode_position(const std::string& bytes) {
  const auto record = from_archive_bytes<DataError, PositionRecord>(bytes, "checkpoint manifest: the training position");
  record.check("checkpoint manifest");
  return {record.position(), record.model_step};
}

}  // namespace cohort::train
