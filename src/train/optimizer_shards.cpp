#include "train/optimizer_shards.hpp"

#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>

#include <algorithm>
#include <unordered_map>

#include "cohort/core/check.hpp"
#include "cohort/tensor/ops.hpp"
#include "core/archive_bytes.hpp"
#include "core/sealed_file.hpp"
#include "tensor/tensor_archive.hpp"

namespace cohort::train {
namespace {

constexpr std::string_view kShardMagic = "COHORTOS";
constexpr std::string_view kShardPrefix = "optimizer-";
constexpr std::uint32_t kShardFormatVersion = 1;

struct PieceRecord {
  std::string variable;
  std::int64_t variable_elements = 0, begin = 0, end = 0;
  std::vector<Tensor> slots;

  template <class Archive>
  void serialize(Archive& archive) {
    archive(variable, variable_elements, begin, end, slots);
  }
};

struct ShardRecord {
  std::string optimizer;
  std::vector<PieceRecord> pieces;

  template <class Archive>
  void serialize(Archive& archive) {
    archive(optimizer, pieces);
  }
};

// The slots of `piece`, as kept: the piece's own, or cut from the variable's whole ones; none before a step.
std::vector<Tensor> slots_of(const optim::Optimizer& optimizer, const nn::Variable& variable, const VariablePiece& piece) {
  const auto found = optimizer.state().find(piece.variable);
  if (found == optimizer.state().end()) return {};
  std::vector<Tensor> slots;
  for (const Tensor& slot : found->second.slots) {
    const std::int64_t length = piece.end - piece.begin;
    if (slot.numel() == variable.value.numel() && slot.shape() != Shape{length})
      slots.push_back(slot.flat().slice(piece.begin, piece.end).clone());
    else {
      COHORT_CHECK(slot.numel() == length, "{}: the state of '{}' has {} elements, neither its piece's {} nor the variable's {}",
                   optimizer.name(), piece.variable, slot.numel(), length, variable.value.numel());
      slots.push_back(slot);
    }
  }
  return slots;
}

}  // namespace

std::string optimizer_shard_name(std::int64_t step, int rank, int ranks) {
  return fmt::format("{}{}.shard-{}-of-{}", kShardPrefix, step, rank, ranks);
}

void remove_optimizer_shards_except(const std::filesystem::path& directory, const std::vector<std::string>& kept) {
  std::error_code listed;
  for (const auto& entry : std::filesystem::directory_iterator(directory.empty() ? "." : directory, listed)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(kShardPrefix) && name.find(".shard-") != std::string::npos &&
        std::find(kept.begin(), kept.end(), name) == kept.end()) {
      std::error_code removed;
      std::filesystem::remove(entry.path(), removed);
    }
  }
}

void write_optimizer_shard(const std::filesystem::path& path, const nn::Sequential& model, const optim::Optimizer& optimizer,
                           const std::vector<VariablePiece>& pieces) {
  ShardRecord record{optimizer.name(), {}};
  for (const VariablePiece& piece : pieces) {
    const auto variable = model.variable(piece.variable);
    auto slots = slots_of(optimizer, *variable, piece);
    if (slots.empty()) continue;
    record.pieces.push_back({piece.variable, variable->value.numel(), piece.begin, piece.end, std::move(slots)});
  }
  write_sealed_file(path, kShardMagic, kShardFormatVersion, to_archive_bytes(record));
}

std::map<std::string, optim::SlotState> read_optimizer_shards(const std::vector<std::filesystem::path>& paths,
                                                              const nn::Sequential& model, const optim::Optimizer& optimizer) {
  std::unordered_map<std::string, nn::VariablePtr> trainable;
  for (const auto& v : model.trainable_variables()) trainable.emplace(v->name, v);
  struct Assembly {
    std::vector<Tensor> slots;                                 // whole, flat, on the CPU
    std::vector<std::pair<std::int64_t, std::int64_t>> ranges;  // the pieces found
  };
  std::map<std::string, Assembly> assembled;
  const auto wanted = static_cast<std::size_t>(optimizer.slots_per_variable());
  for (const auto& path : paths) {
    const std::string name = path.string();
    const auto record = from_archive_bytes<DataError, ShardRecord>(
        read_sealed_file(path, kShardMagic, kShardFormatVersion, "optimizer shard"),
        fmt::format("optimizer shard {}", name));
    COHORT_CHECK_AS(DataError, record.optimizer == optimizer.name(), "optimizer shard {} holds the state of {}, not of {}", name,
                    record.optimizer, optimizer.name());
    for (const PieceRecord& piece : record.pieces) {
      const auto variable = trainable.find(piece.variable);
      COHORT_CHECK_AS(DataError, variable != trainable.end(), "optimizer shard {}: the model has no trainable variable '{}'",
                      name, piece.variable);
      const std::int64_t elements = variable->second->value.numel();
      COHORT_CHECK_AS(DataError,
                      piece.variable_elements == elements && 0 <= piece.begin && piece.begin < piece.end && piece.end <= elements,
                      "optimizer shard {}: elements [{}, {}) of '{}' ({} elements when saved) do not fit its {}", name, piece.begin,
                      piece.end, piece.variable, piece.variable_elements, elements);
      COHORT_CHECK_AS(DataError, piece.slots.size() == wanted, "optimizer shard {}: '{}' has {} slots, {} keeps {}", name,
                      piece.variable, piece.slots.size(), optimizer.name(), wanted);
      Assembly& whole = assembled[piece.variable];
      if (whole.slots.empty())
        for (std::size_t s = 0; s < wanted; ++s) whole.slots.emplace_back(Shape{elements});
      for (std::size_t s = 0; s < wanted; ++s) {
        const Tensor& slot = piece.slots[s];
        COHORT_CHECK_AS(DataError, slot.numel() == piece.end - piece.begin && slot.dtype() == DType::Float32,
                        "optimizer shard {}: a slot of '{}' has {} {} elements for a piece of {}", name, piece.variable,
                        slot.numel(), dtype_name(slot.dtype()), piece.end - piece.begin);
        ops::copy(slot.flat(), whole.slots[s].slice(piece.begin, piece.end));
      }
      whole.ranges.emplace_back(piece.begin, piece.end);
    }
  }
  std::map<std::string, optim::SlotState> state;
  for (auto& [variable, whole] : assembled) {
    std::sort(whole.ranges.begin(), whole.ranges.end());
    std::int64_t covered = 0;
    for (const auto& [begin, end] : whole.ranges) {
      COHORT_CHECK_AS(DataError, begin == covered, "the optimizer shards {} elements [{}, {}) of '{}'",
                      begin < covered ? "hold twice" : "leave out", std::min(begin, covered), std::max(begin, covered), variable);
      covered = end;
    }
    const Tensor& value = trainable.at(variable)->value;
    COHORT_CHECK_AS(DataError, covered == value.numel(), "the optimizer shards leave out elements [{}, {}) of '{}'", covered,
                    value.numel(), variable);
    optim::SlotState& slots = state[variable];
    for (const Tensor& slot : whole.slots) slots.slots.push_back(slot.view(value.shape()));
  }
  return state;
}

void keep_only_pieces(optim::Optimizer& optimizer, const nn::Sequential& model, const std::vector<VariablePiece>& pieces) {
  std::map<std::string, optim::SlotState> kept;
  for (const VariablePiece& piece : pieces) {
    auto slots = slots_of(optimizer, *model.variable(piece.variable), piece);
    if (!slots.empty()) kept[piece.variable].slots = std::move(slots);
  }
  optimizer.replace_state(std::move(kept));
}

}  // namespace cohort::train
