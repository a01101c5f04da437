#pragma once
// The optimizer state of a sharded update (ZeRO) in checkpoints: each rank writes the slots of its pieces
// of the variables to a shard file of its own, and the checkpoint names every shard. Reading assembles the
// whole state again, so a run resumes on any process count and under any strategy.

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "cohort/nn/sequential.hpp"
#include "cohort/optim/optimizer.hpp"
#include "cohort/train/variable_pieces.hpp"

namespace cohort::train {

// "optimizer-<step>.shard-<rank>-of-<ranks>": the shard file of `rank` in the checkpoint of `step`.
std::string optimizer_shard_name(std::int64_t step, int rank, int ranks);
// Removes the shard files in `directory` that `kept` does not name (those of earlier checkpoints).
void remove_optimizer_shards_except(const std::filesystem::path& directory, const std::vector<std::string>& kept);

// Writes the optimizer's slots of `pieces` to `path`: each piece's slots as the optimizer keeps them (the
// piece's length), or cut out of a variable's whole slots where it still keeps those.
void write_optimizer_shard(const std::filesystem::path& path, const nn::Sequential& model, const optim::Optimizer& optimizer,
                           const std::vector<VariablePiece>& pieces);

// The whole state of every trainable variable of `model` from its shards, each slot with its variable's
// shape; a variable no shard holds has none (no step updated it yet). DataError naming the file for a
// missing, damaged or foreign shard, and for pieces that overlap or leave part of a variable out.
std::map<std::string, optim::SlotState> read_optimizer_shards(const std::vector<std::filesystem::path>& paths,
                                                              const nn::Sequential& model, const optim::Optimizer& optimizer);

// Keeps only the optimizer's state of `pieces`, each slot the piece's length (cut from the whole where
// the optimizer holds a variable's whole state, as after a resume), and drops the rest.
void keep_only_pieces(optim::Optimizer& optimizer, const nn::Sequential& model, const std::vector<VariablePiece>& pieces);

}  // namespace cohort::train
