#include "cohort/train/checkpoint.hpp"

#include <cereal/types/map.hpp>
#include <cereal/types/utility.hpp>
#include <cstring>
#include <fstream>
#include <sstream>

#include "cohort/tensor/ops.hpp"
#include "core/sealed_file.hpp"
#include "core/tensor_archive.hpp"
#include "train/position_codec.hpp"

namespace cohort::train {
namespace {

constexpr std::string_view kMagic = "COHORTCK";

struct Payload {
  std::vector<std::pair<std::string, Tensor>> variables;
  std::string optimizer_state;
  std::uint64_t model_step = 0;
  std::int64_t epoch = 0, batch_in_epoch = 0, global_step = 0;
  std::uint64_t data_seed = 0;
  std::vector<Logs> history;

  template <class Archive>
  void serialize(Archive& archive) {
    archive(variables, optimizer_state, model_step, epoch, batch_in_epoch, global_step, data_seed, history);
  }
};

}  // namespace

void save_checkpoint(const std::filesystem::path& path, const nn::Sequential& model, const optim::Optimizer& optimizer,
                     const TrainingPosition& position) {
  Payload payload;
  for (const auto& v : model.variables()) payload.variables.emplace_back(v->name, v->value);
  std::ostringstream optimizer_state;
  optimizer.save_state(optimizer_state);
  payload.optimizer_state = optimizer_state.str();
  payload.model_step = model.step();
  payload.epoch = position.epoch;
  payload.batch_in_epoch = position.batch_in_epoch;
  payload.global_step = position.global_step;
  payload.data_seed = position.data_seed;
  payload.history = position.history.epochs;

  std::ostringstream body;
  {
    cereal::PortableBinaryOutputArchive archive(body);
    archive(payload);
  }
  write_sealed_file(path, kMagic, kCheckpointFormatVersion, body.str());
}

TrainingPosition load_checkpoint(const std::filesystem::path& path, nn::Sequential& model, optim::Optimizer& optimizer) {
  const std::string name = path.string();
  const std::string content = read_sealed_file(path, kMagic, kCheckpointFormatVersion, "checkpoint");
  Payload payload;
  try {
    std::istringstream body(content);
    cereal::PortableBinaryInputArchive archive(body);
    archive(payload);
  } catch (const cereal::Exception& e) {
    throw DataError(fmt::format("checkpoint {}: payload cannot be decoded: {}", name, e.what()));
  }

  // Check everything before changing anything.
  std::map<std::string, const Tensor*> saved;
  for (const auto& [variable_name, tensor] : payload.variables) saved[variable_name] = &tensor;
  const auto variables = model.variables();
  for (const auto& v : variables) {
    const auto it = saved.find(v->name);
    if (it == saved.end()) throw DataError(fmt::format("checkpoint {}: has no variable '{}' of this model", name, v->name));
    if (it->second->shape() != v->value.shape())
      throw DataError(fmt::format("checkpoint {}: variable '{}' has shape {}, the model {}", name, v->name,
                                  it->second->shape(), v->value.shape()));
  }
  if (saved.size() != variables.size())
    throw DataError(fmt::format("checkpoint {}: holds {} variables, the model {}", name, saved.size(), variables.size()));
  std::istringstream optimizer_state(payload.optimizer_state);
  optimizer.load_state(optimizer_state);
  for (const auto& v : variables) ops::copy(*saved[v->name], v->value);
  model.set_step(payload.model_step);
  return {payload.epoch, payload.batch_in_epoch, payload.global_step, payload.data_seed, History{payload.history}};
}

namespace {

struct PositionRecord {
  std::uint64_t model_step = 0;
  std::int64_t epoch = 0, batch_in_epoch = 0, global_step = 0;
  std::uint64_t data_seed = 0;
  std::vector<Logs> history;

  template <class Archive>
  void serialize(Archive& archive) {
    archive(model_step, epoch, batch_in_epoch, global_step, data_seed, history);
  }
};

}  // namespace

std::string encode_position(const TrainingPosition& position, std::uint64_t model_step) {
  const PositionRecord record{model_step, position.epoch, position.batch_in_epoch, position.global_step,
                              position.data_seed, position.history.epochs};
  std::ostringstream out;
  {
    cereal::PortableBinaryOutputArchive archive(out);
    archive(record);
  }
  return out.str();
}

std::pair<TrainingPosition, std::uint64_t> decode_position(const std::string& bytes) {
  PositionRecord record;
  try {
    std::istringstream in(bytes);
    cereal::PortableBinaryInputArchive archive(in);
    archive(record);
  } catch (const cereal::Exception& e) {
    throw DataError(fmt::format("checkpoint manifest: the training position cannot be decoded: {}", e.what()));
  }
  return {{record.epoch, record.batch_in_epoch, record.global_step, record.data_seed, History{record.history}}, record.model_step};
}

}  // namespace cohort::train
