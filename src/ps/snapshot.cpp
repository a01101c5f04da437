#include "cohort/ps/snapshot.hpp"

#include <cereal/types/vector.hpp>
#include <algorithm>
#include <map>
#include <regex>
#include <set>

#include "cohort/core/check.hpp"
#include "cohort/ps/placement.hpp"
#include "core/archive_bytes.hpp"
#include "core/sealed_file.hpp"
#include "tensor/tensor_archive.hpp"

namespace cohort::ps {

template <class Archive>
void serialize(Archive& archive, SavedShard& s) {
  archive(s.variable, s.row_begin, s.row_end, s.trainable, s.value, s.slots);
}

template <class Archive>
void serialize(Archive& archive, ServerSnapshot& s) {
  archive(s.server, s.servers, s.step, s.optimizer, s.iterations, s.shards);
}

template <class Archive>
void serialize(Archive& archive, SnapshotFile& f) {
  archive(f.name, f.bytes, f.crc);
}

template <class Archive>
void serialize(Archive& archive, Manifest& m) {
  archive(m.step, m.policy, m.servers, m.plan_fingerprint, m.files, m.trainer_state);
}

namespace {

constexpr std::string_view kSnapshotMagic = "COHORTPS";
constexpr std::string_view kManifestMagic = "COHORTMF";
constexpr std::uint32_t kFormatVersion = 3;  // 3: the manifest's trainer state records the CPU kernels' instruction set

template <typename T>
T decode(const std::string& bytes, const std::filesystem::path& path, std::string_view what) {
  return from_archive_bytes<DataError, T>(bytes, fmt::format("{} {}: payload", what, path.string()));
}

}  // namespace

std::string snapshot_name(std::int64_t step, int server, int servers) {
  return fmt::format("ps-step-{}/server-{}-of-{}.snapshot", step, server, servers);
}

SnapshotFile write_snapshot(const std::filesystem::path& directory, std::int64_t checkpoint_step, const ServerSnapshot& snapshot) {
  const std::string name = snapshot_name(checkpoint_step, snapshot.server, snapshot.servers);
  const std::string payload = to_archive_bytes(snapshot);
  const std::uint32_t crc = write_sealed_file(directory / name, kSnapshotMagic, kFormatVersion, payload);
  return {.name = name, .bytes = payload.size(), .crc = crc};
}

void write_manifest(const std::filesystem::path& directory, const Manifest& manifest) {
  write_sealed_file(directory / kManifestName, kManifestMagic, kFormatVersion, to_archive_bytes(manifest));
}

Manifest read_manifest(const std::filesystem::path& directory) {
  const auto path = directory / kManifestName;
  return decode<Manifest>(read_sealed_file(path, kManifestMagic, kFormatVersion, "checkpoint manifest"), path,
                          "checkpoint manifest");
}

std::vector<ServerSnapshot> read_snapshots(const std::filesystem::path& directory, const Manifest& manifest) {
  std::vector<ServerSnapshot> snapshots;
  for (const SnapshotFile& file : manifest.files) {
    const auto path = directory / file.name;
    const std::string payload = read_sealed_file(path, kSnapshotMagic, kFormatVersion, "parameter-server snapshot");
    COHORT_CHECK_AS(DataError, payload.size() == file.bytes && crc32_of(payload.data(), payload.size()) == file.crc,
                    "parameter-server snapshot {}: not the file the manifest names ({} bytes, CRC {:08x} recorded)",
                    path.string(), file.bytes, file.crc);
    snapshots.push_back(decode<ServerSnapshot>(payload, path, "parameter-server snapshot"));
  }
  return snapshots;
}

bool holds_complete_snapshots(const std::filesystem::path& step_directory) {
  std::map<int, std::set<int>> servers_of;  // N -> the K present
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(step_directory, error)) {
    static const std::regex kSnapshotName(R"(server-(\d{1,6})-of-(\d{1,6})\.snapshot)");
    const std::string name = entry.path().filename().string();
    std::smatch match;
    if (!std::regex_match(name, match, kSnapshotName)) continue;
    const int server = std::stoi(match[1]), servers = std::stoi(match[2]);
    if (server < servers) servers_of[servers].insert(server);
  }
  return std::any_of(servers_of.begin(), servers_of.end(), [](const auto& set) { return static_cast<int>(set.second.size()) == set.first; });
}

void remove_old_snapshots(const std::filesystem::path& directory, std::int64_t keep_step) {
  const std::string keep = fmt::format("ps-step-{}", keep_step);
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.starts_with("ps-step-") && name != keep) std::filesystem::remove_all(entry.path(), error);
  }
}

void copy_rows(const std::vector<ServerSnapshot>& snapshots, const std::string& variable, std::int64_t row_begin,
               std::int64_t row_end, Tensor& value, std::vector<Tensor>* slots) {
  const std::int64_t row_size = row_elements(value.shape());
  std::int64_t covered = 0;
  std::size_t slot_count = 0;
  bool first = true;
  for (const auto& snapshot : snapshots) {
    for (const SavedShard& saved : snapshot.shards) {
      if (saved.variable != variable) continue;
      const std::int64_t begin = std::max(row_begin, saved.row_begin), end = std::min(row_end, saved.row_end);
      if (begin >= end) continue;
      COHORT_CHECK_AS(DataError, row_elements(saved.value.shape()) == row_size,
                      "checkpoint: '{}' was saved with rows of {} values, this model has {}", variable,
                      row_elements(saved.value.shape()), row_size);
      if (first) {
        slot_count = saved.slots.size();
        if (slots != nullptr) {
          slots->clear();
          for (std::size_t i = 0; i < slot_count; ++i) slots->emplace_back(value.shape());
        }
        first = false;
      }
      COHORT_CHECK_AS(DataError, saved.slots.size() == slot_count, "checkpoint: shards of '{}' disagree on optimizer slots",
                      variable);
      const std::int64_t count = (end - begin) * row_size;
      const std::int64_t from = (begin - saved.row_begin) * row_size, to = (begin - row_begin) * row_size;
      std::copy_n(saved.value.data() + from, count, value.data() + to);
      if (slots != nullptr)
        for (std::size_t i = 0; i < slot_count; ++i)
          std::copy_n(saved.slots[i].data() + from, count, (*slots)[i].data() + to);
      covered += end - begin;
    }
  }
  COHORT_CHECK_AS(DataError, covered == row_end - row_begin,
                  "checkpoint: rows {}..{} of '{}' are not all in the snapshots ({} of {} found)", row_begin, row_end,
                  variable, covered, row_end - row_begin);
}

}  // namespace cohort::ps
