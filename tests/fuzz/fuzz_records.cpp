// The record decoders on any bytes: checkpoints (raw, and sealed with a valid checksum around the fuzzed
// payload, which is where a damaged or crafted record gets past the seal), the parameter servers' manifest
// and snapshots, the training position and the optimizer state. Each input must load or fail with
// DataError; no length in the bytes may make decoding allocate more than the bytes hold.
#include <fstream>
#include <sstream>

#include "cohort/core/error.hpp"
#include "cohort/nn/dense.hpp"
#include "cohort/nn/sequential.hpp"
#include "cohort/optim/adam.hpp"
#include "cohort/ps/snapshot.hpp"
#include "cohort/train/checkpoint.hpp"
#include "core/sealed_file.hpp"
#include "fuzz_util.hpp"
#include "train/position_codec.hpp"

using namespace cohort;

namespace {

// A sealed file's magic and version, read from the first 12 bytes of one written by the library.
struct Seal {
  std::string magic;
  std::uint32_t version = 0;
};

Seal seal_of(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  Seal seal{std::string(8, '\0')};
  in.read(seal.magic.data(), 8);
  in.read(reinterpret_cast<char*>(&seal.version), sizeof seal.version);
  if (!in) std::abort();
  return seal;
}

struct Fixture {
  std::filesystem::path directory = fuzz::scratch_directory("cohort-fuzz-records");
  nn::Sequential model{Shape{4}, 1};
  optim::Adam optimizer;
  Seal checkpoint, manifest, snapshot;
  std::string snapshot_name = ps::snapshot_name(1, 0, 1);

  Fixture() {
    model.add(nn::Dense(3));
    train::save_checkpoint(directory / "valid.ckpt", model, optimizer, {});
    checkpoint = seal_of(directory / "valid.ckpt");
    ps::write_manifest(directory, ps::Manifest{});
    manifest = seal_of(directory / ps::kManifestName);
    ps::write_snapshot(directory, 1, ps::ServerSnapshot{});
    snapshot = seal_of(directory / snapshot_name);
  }
};

Fixture& records_fixture() {
  static Fixture instance;
  return instance;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  Fixture& f = records_fixture();
  const auto& dir = f.directory;
  ps::ServerSnapshot snapshot{.server = 0, .servers = 1, .step = 3, .optimizer = "Adam", .iterations = 3};
  snapshot.shards.push_back({.variable = "dense/kernel", .row_begin = 0, .row_end = 4, .value = Tensor({4, 3}),
                             .slots = {Tensor({4, 3}), Tensor({4, 3})}});
  ps::write_snapshot(dir, 2, snapshot);
  const std::string snapshot_name = ps::snapshot_name(2, 0, 1);
  ps::write_manifest(dir, {.step = 2, .policy = "round-robin", .servers = 1, .plan_fingerprint = 42,
                           .files = {{.name = snapshot_name, .bytes = 10, .crc = 7}}, .trainer_state = "position"});
  std::ostringstream optimizer_state;
  f.optimizer.save_state(optimizer_state);
  const auto file_bytes = [](const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  fuzz::write_seeds({
      fuzz::mode(0, file_bytes(dir / "valid.ckpt")),
      fuzz::mode(1, read_sealed_file(dir / "valid.ckpt", f.checkpoint.magic, f.checkpoint.version, "seed")),
      fuzz::mode(2, read_sealed_file(dir / ps::kManifestName, f.manifest.magic, f.manifest.version, "seed")),
      fuzz::mode(3, read_sealed_file(dir / snapshot_name, f.snapshot.magic, f.snapshot.version, "seed")),
      fuzz::mode(4, train::encode_position({}, 5)),
      fuzz::mode(5, optimizer_state.str()),
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Fixture& fixture = records_fixture();
  static fuzz::MemoryFile file;
  if (size == 0) return 0;
  const std::string bytes(fuzz::rest(data, size));
  const auto& dir = fixture.directory;
  try {
    switch (data[0] % 6) {
      case 0:
        train::load_checkpoint(file.holding(bytes), fixture.model, fixture.optimizer);
        break;
      case 1:
        write_sealed_file(dir / "fuzzed.ckpt", fixture.checkpoint.magic, fixture.checkpoint.version, bytes);
        train::load_checkpoint(dir / "fuzzed.ckpt", fixture.model, fixture.optimizer);
        break;
      case 2:
        write_sealed_file(dir / ps::kManifestName, fixture.manifest.magic, fixture.manifest.version, bytes);
        ps::read_manifest(dir);
        break;
      case 3: {
        ps::Manifest manifest;
        const std::uint32_t crc = write_sealed_file(dir / fixture.snapshot_name, fixture.snapshot.magic, fixture.snapshot.version, bytes);
        manifest.files.push_back({.name = fixture.snapshot_name, .bytes = bytes.size(), .crc = crc});
        ps::read_snapshots(dir, manifest);
        break;
      }
      case 4:
        train::decode_position(bytes);
        break;
      case 5: {
        std::istringstream in(bytes);
        fixture.optimizer.load_state(in);
        break;
      }
    }
  } catch (const DataError&) {
  }
  return 0;
}
