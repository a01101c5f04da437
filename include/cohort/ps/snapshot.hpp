#pragma once
// Checkpoints of parameter-server training that outlive the topology. Each server writes a snapshot of
// its shards (values, optimizer slots, iteration count) to checkpoint_dir/ps-step-N/server-K-of-S.snapshot;
// then the chief writes checkpoint_dir/ps.manifest naming the snapshots with their sizes and checksums, and
// the trainer's own state. The manifest is written last and atomically, so it always names a complete set.
// Restoring reads the variables row by row from whatever shards hold them, so a run may continue on another
// number of servers or under another placement policy.
//
//   auto manifest = ps::read_manifest(dir / ps::kManifestName);
//   auto snapshots = ps::read_snapshots(dir, manifest);
//   ps::copy_rows(snapshots, "dense/kernel", 0, 512, value, &slots);

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "cohort/tensor/tensor.hpp"

namespace cohort::ps {

inline constexpr const char* kManifestName = "ps.manifest";

struct SavedShard {
  std::string variable;
  std::int64_t row_begin = 0, row_end = 0;  // along the variable's first axis
  bool trainable = true;
  Tensor value;
  std::vector<Tensor> slots{};  // the optimizer's state for this shard
};

struct ServerSnapshot {
  int server = 0, servers = 1;
  std::int64_t step = 0;  // updates applied when it was taken
  std::string optimizer;  // Optimizer::name()
  std::int64_t iterations = 0;
  std::vector<SavedShard> shards{};
};

struct SnapshotFile {
  std::string name;  // relative to the checkpoint directory
  std::uint64_t bytes = 0;
  std::uint32_t crc = 0;
};

struct Manifest {
  std::int64_t step = 0;
  std::string policy;
  int servers = 0;
  std::uint64_t plan_fingerprint = 0;
  std::vector<SnapshotFile> files;
  std::string trainer_state;  // opaque to the parameter servers: the position in training
};

// "ps-step-120/server-1-of-2.snapshot"
std::string snapshot_name(std::int64_t step, int server, int servers);

// Atomic, sealed with a CRC; returns the file's size and checksum for the manifest.
// Written as snapshot_name(checkpoint_step, ...): the step of the checkpoint, which in asynchronous training
// may differ from the updates this server has applied (snapshot.step).
SnapshotFile write_snapshot(const std::filesystem::path& directory, std::int64_t checkpoint_step, const ServerSnapshot& snapshot);
void write_manifest(const std::filesystem::path& directory, const Manifest& manifest);
// Throw DataError naming the file for a missing, damaged, foreign or mismatching file.
Manifest read_manifest(const std::filesystem::path& directory);
std::vector<ServerSnapshot> read_snapshots(const std::filesystem::path& directory, const Manifest& manifest);
// Whether a checkpoint step's directory ("ps-step-10") holds every server's snapshot of one topology
// ("server-K-of-N.snapshot" for every K < N).
bool holds_complete_snapshots(const std::filesystem::path& step_directory);
// Removes the snapshot directories of steps other than `keep_step`.
void remove_old_snapshots(const std::filesystem::path& directory, std::int64_t keep_step);

// Fills rows [row_begin, row_end) of `variable` into `value` (and into `slots` when given) from the saved
// shards that hold them; throws DataError when the snapshots do not cover them or shapes disagree.
void copy_rows(const std::vector<ServerSnapshot>& snapshots, const std::string& variable, std::int64_t row_begin,
               std::int64_t row_end, Tensor& value, std::vector<Tensor>* slots);

}  // namespace cohort::ps
