#include <catch2/catch.hpp>
#include <cereal/types/map.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>
#include <fstream>
#include <limits>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

#include "cohort/core/error.hpp"
#include "cohort/nn/activation_layer.hpp"
#include "cohort/nn/batch_normalization.hpp"
#include "cohort/nn/dense.hpp"
#include "cohort/nn/model_file.hpp"
#include "cohort/optim/adam.hpp"
#include "cohort/comm/inproc.hpp"
#include "cohort/train/checkpoint.hpp"
#include "cohort/train/parameter_server.hpp"
#include "cohort/train/strategy.hpp"
#include "cohort/train/update.hpp"
#include "core/archive_bytes.hpp"
#include "tensor/tensor_archive.hpp"
#include "train/position_codec.hpp"
#include "test_util.hpp"

using namespace cohort;
using test_util::ScratchDirectory;

namespace {

nn::Sequential small_model(std::uint64_t seed) {
  nn::Sequential model({4}, seed);
  model.add(nn::Dense(3)).add(nn::BatchNormalization()).add(nn::Softmax());
  return model;
}

// One Adam step so that the optimizer has state worth saving.
void take_a_step(nn::Sequential& model, optim::Adam& adam) {
  model.train();
  model.forward(test_util::random_tensor({5, 4}, 3));
  model.backward(test_util::random_tensor({5, 3}, 4));
  train::update_variables(adam, model.trainable_variables());
}

std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

}  // namespace

TEST_CASE("a checkpoint restores variables, optimizer state, step counter and position", "[train][checkpoint]") {
  ScratchDirectory dir("checkpoint_ok");
  nn::Sequential model = small_model(1);
  optim::Adam adam;
  take_a_step(model, adam);
  train::TrainingPosition position{.epoch = 2, .batch_in_epoch = 5, .global_step = 17, .data_seed = 99};
  position.history.epochs.push_back({{"loss", 0.5}});
  const auto path = dir.path() / "latest.ckpt";
  train::save_checkpoint(path, model, adam, position);
  CHECK(std::distance(std::filesystem::directory_iterator(dir.path()), {}) == 1);  // no temporary left behind

  nn::Sequential other = small_model(2);
  optim::Adam other_adam;
  const auto restored = train::load_checkpoint(path, other, other_adam);
  CHECK(restored.epoch == 2);
  CHECK(restored.batch_in_epoch == 5);
  CHECK(restored.global_step == 17);
  CHECK(restored.data_seed == 99);
  CHECK(restored.history.epochs.at(0).at("loss") == 0.5);
  CHECK(other.step() == model.step());
  CHECK(other_adam.iterations() == 1);
  for (const auto& v : model.variables()) CHECK(other.variable(v->name)->value.to_vector() == v->value.to_vector());
  CHECK(other_adam.state().at("dense/kernel").slots[0].to_vector() == adam.state().at("dense/kernel").slots[0].to_vector());
  // Given to the model-file reader, a checkpoint is named for what it is.
  CHECK_THROWS_WITH(nn::load_model(path), Catch::Contains("not a cohort model file, but a checkpoint (fit() with resume"));
}

TEST_CASE("damaged, truncated, foreign and mismatched checkpoints are refused and change nothing", "[train][checkpoint]") {
  ScratchDirectory dir("checkpoint_bad");
  nn::Sequential model = small_model(1);
  optim::Adam adam;
  take_a_step(model, adam);
  const auto path = dir.path() / "latest.ckpt";
  train::save_checkpoint(path, model, adam, {});
  const std::string good = read_bytes(path);

  nn::Sequential target = small_model(7);
  optim::Adam target_adam;
  const auto before = target.variable("dense/kernel")->value.to_vector();
  auto expect_refused = [&](const std::string& bytes, const std::string& fragment) {
    write_bytes(path, bytes);
    CHECK_THROWS_WITH(train::load_checkpoint(path, target, target_adam), Catch::Contains(fragment));
    CHECK(target.variable("dense/kernel")->value.to_vector() == before);
    CHECK(target_adam.iterations() == 0);
  };
  std::string flipped = good;
  flipped[flipped.size() / 2] ^= 0x40;
  expect_refused(flipped, "checksum");
  expect_refused(good.substr(0, good.size() - 10), "truncated");
  expect_refused(good.substr(0, 10), "shorter than");
  expect_refused("PK\x03\x04 not a checkpoint at all, just some zip-like bytes", "magic");
  std::string future = good;
  future[8] = 9;
  expect_refused(future, "format version 9");

  // A checkpoint of another architecture.
  nn::Sequential wider({4}, 1);
  wider.add(nn::Dense(5)).add(nn::BatchNormalization()).add(nn::Softmax());
  optim::Adam wider_adam;
  train::save_checkpoint(path, wider, wider_adam, {});
  CHECK_THROWS_WITH(train::load_checkpoint(path, target, target_adam), Catch::Contains("dense/kernel"));
  CHECK_THROWS_AS(train::load_checkpoint(dir.path() / "absent.ckpt", target, target_adam), IoError);
}

TEST_CASE("temporary files of writers that died are removed by the next checkpoint", "[train][checkpoint]") {
  ScratchDirectory dir("checkpoint_temporaries");
  const auto path = dir.path() / "latest.ckpt";
  // A writer that no longer runs (pids never reach this value) and one that still does (our parent).
  const auto dead = dir.path() / "latest.ckpt.tmp.2147483646";
  const auto alive = dir.path() / fmt::format("latest.ckpt.tmp.{}", ::getppid());
  const auto other = dir.path() / "other.ckpt.tmp.2147483646";
  for (const auto& p : {dead, alive, other}) write_bytes(p, std::string(1000, 'x'));
  nn::Sequential model = small_model(1);
  optim::Adam adam;
  train::save_checkpoint(path, model, adam, {});
  CHECK(std::filesystem::exists(path));
  CHECK(!std::filesystem::exists(dead));
  CHECK(std::filesystem::exists(alive));  // its writer may still rename it
  CHECK(std::filesystem::exists(other));  // another file's business
}

TEST_CASE("resuming parameter servers without their manifest refuses instead of deleting the snapshots", "[train][checkpoint][ps]") {
  ScratchDirectory dir("ps_without_manifest");
  std::filesystem::create_directories(dir.path() / "ps-step-40");
  write_bytes(dir.path() / "ps-step-40" / "server-0-of-1.snapshot", "snapshot");
  comm::InProcessGroup group(2);
  train::ParameterServer strategy(group.transport(0), 1);
  nn::Sequential model = small_model(1);
  optim::Adam adam;
  try {
    strategy.restore_checkpoint(dir.path(), model, adam);
    FAIL("expected a DataError");
  } catch (const DataError& e) {
    CHECK_THAT(e.what(), Catch::Contains("ps-step-40") && Catch::Contains("ps.manifest") && Catch::Contains("refusing"));
  }
  CHECK(std::filesystem::exists(dir.path() / "ps-step-40" / "server-0-of-1.snapshot"));
  // An empty directory is a fresh start.
  ScratchDirectory empty("ps_fresh");
  CHECK(!strategy.restore_checkpoint(empty.path(), model, adam).has_value());
}

TEST_CASE("a checkpoint that failed before its commit does not block resuming parameter servers", "[train][checkpoint][ps]") {
  // A full disk at the first checkpoint: ps 1 wrote its snapshot, ps 0 could not, the manifest was never written.
  ScratchDirectory dir("ps_uncommitted");
  std::filesystem::create_directories(dir.path() / "ps-step-10");
  write_bytes(dir.path() / "ps-step-10" / "server-1-of-2.snapshot", "snapshot");
  write_bytes(dir.path() / "ps-step-10" / "server-0-of-2.snapshot.tmp.2147483646", "half a snapshot");
  comm::InProcessGroup group(3);
  train::ParameterServer strategy(group.transport(0), 1);
  nn::Sequential model = small_model(1);
  optim::Adam adam;
  CHECK(!strategy.restore_checkpoint(dir.path(), model, adam).has_value());  // a fresh start
  // With every server's snapshot, the set was complete: the manifest is missing, not uncommitted.
  write_bytes(dir.path() / "ps-step-10" / "server-0-of-2.snapshot", "snapshot");
  CHECK_THROWS_AS(strategy.restore_checkpoint(dir.path(), model, adam), DataError);
}

TEST_CASE("a checkpoint that is a loop of symbolic links is refused by name", "[train][checkpoint]") {
  ScratchDirectory dir("checkpoint_link_loop");
  std::filesystem::create_symlink("latest.ckpt", dir.path() / "latest.ckpt");
  nn::Sequential model = small_model(1);
  optim::Adam adam;
  train::Local local;
  CHECK_THROWS_AS(local.restore_checkpoint(dir.path(), model, adam), DataError);
  CHECK_THROWS_WITH(local.restore_checkpoint(dir.path(), model, adam),
                    Catch::Contains("latest.ckpt cannot be read") && Catch::Contains("symbolic links"));
  comm::InProcessGroup group(3);
  std::filesystem::create_symlink("ps.manifest", dir.path() / "ps.manifest");
  train::ParameterServer servers(group.transport(0), 1);
  CHECK_THROWS_WITH(servers.restore_checkpoint(dir.path(), model, adam), Catch::Contains("ps.manifest cannot be read"));
  // A link to nothing is refused too, not taken for a fresh start.
  std::filesystem::remove(dir.path() / "latest.ckpt");
  std::filesystem::create_symlink("/nonexistent/latest.ckpt", dir.path() / "latest.ckpt");
  CHECK_THROWS_WITH(local.restore_checkpoint(dir.path(), model, adam),
                    Catch::Contains("latest.ckpt is a link to /nonexistent/latest.ckpt, which does not exist"));
}

TEST_CASE("a checkpoint that is a FIFO or a device is refused by name, not read without end", "[train][checkpoint]") {
  ScratchDirectory dir("checkpoint_not_a_file");
  nn::Sequential model = small_model(1);
  optim::Adam adam;
  train::Local local;
  REQUIRE(::mkfifo((dir.path() / "latest.ckpt").c_str(), 0600) == 0);
  CHECK_THROWS_WITH(local.restore_checkpoint(dir.path(), model, adam), Catch::Contains("latest.ckpt: is a FIFO"));
  std::filesystem::remove(dir.path() / "latest.ckpt");
  std::filesystem::create_symlink("/dev/zero", dir.path() / "latest.ckpt");
  CHECK_THROWS_AS(local.restore_checkpoint(dir.path(), model, adam), DataError);
  CHECK_THROWS_WITH(local.restore_checkpoint(dir.path(), model, adam), Catch::Contains("is a character device"));
  comm::InProcessGroup group(3);
  REQUIRE(::mkfifo((dir.path() / "ps.manifest").c_str(), 0600) == 0);
  train::ParameterServer servers(group.transport(0), 1);
  CHECK_THROWS_WITH(servers.restore_checkpoint(dir.path(), model, adam), Catch::Contains("ps.manifest: is a FIFO"));
}

TEST_CASE("a checkpoint is never written over a device, a FIFO or a directory", "[train][checkpoint]") {
  ScratchDirectory dir("not-regular");
  nn::Sequential model = small_model(1);
  optim::Adam adam;
  REQUIRE(::mkfifo((dir.path() / "fifo.ckpt").c_str(), 0600) == 0);
  std::filesystem::create_directory(dir.path() / "directory.ckpt");
  for (const char* name : {"fifo.ckpt", "directory.ckpt"}) {
    INFO(name);
    CHECK_THROWS_WITH(train::save_checkpoint(dir.path() / name, model, adam, {}), Catch::Contains("it exists and is not a regular file"));
  }
  CHECK(std::filesystem::is_fifo(dir.path() / "fifo.ckpt"));
}

TEST_CASE("a recorded loss scale that no training leaves is refused by name", "[train][checkpoint][dtype]") {
  for (const auto& [scale, finite_steps] : std::vector<std::pair<float, std::int64_t>>{
           {std::nanf(""), 0}, {-4.0f, 0}, {3.0f, 0}, {1e-40f, 0}, {std::numeric_limits<float>::infinity(), 5}, {1024.0f, -1},
           {1024.0f, 2000}, {0.0f, 7}}) {
    INFO(scale << " after " << finite_steps);
    train::TrainingPosition position;
    position.loss_scale = scale;
    position.loss_scale_finite_steps = finite_steps;
    CHECK_THROWS_AS(train::decode_position(train::encode_position(position, 0)), DataError);
  }
  train::TrainingPosition good;
  good.loss_scale = 0.25f;
  good.loss_scale_finite_steps = 1999;
  CHECK(train::decode_position(train::encode_position(good, 0)).first.loss_scale == 0.25f);
}

TEST_CASE("lengths in a record cannot make decoding allocate more than the record holds", "[train][checkpoint]") {
  // What a damaged or crafted record behind a valid checksum may say: a container or tensor far longer
  // than the bytes that follow. Decoding must fail with DataError before allocating for it.
  const std::string huge_length = to_archive_bytes(std::uint64_t{1} << 40);
  CHECK_THROWS_MATCHES((from_archive_bytes<DataError, std::vector<float>>(huge_length, "a vector")), DataError,
                       Catch::Message("a vector cannot be decoded: a length of 1099511627776 before offset 9 exceeds the 0 bytes left"));
  CHECK_THROWS_AS((from_archive_bytes<DataError, std::string>(huge_length, "a string")), DataError);
  CHECK_THROWS_AS((from_archive_bytes<DataError, std::map<std::string, float>>(huge_length, "a map")), DataError);
  // A tensor's record: its extents, its element type's code, then the values.
  const auto tensor_record = [](const std::vector<std::int64_t>& dims, DType type) {
    return to_archive_bytes(dims) + static_cast<char>(type);
  };
  const std::string big_tensor = tensor_record({1 << 20, 1 << 15}, DType::Float32);  // 128 GiB of floats
  CHECK_THROWS_WITH((from_archive_bytes<DataError, Tensor>(big_tensor, "a tensor")),
                    Catch::Contains("float32 tensor of 34359738368 elements is longer than the 0 bytes left"));
  const std::string big_low = tensor_record({1 << 20, 1 << 15}, DType::BFloat16) + std::string(8, '\0');
  CHECK_THROWS_WITH((from_archive_bytes<DataError, Tensor>(big_low, "a tensor")),
                    Catch::Contains("bfloat16 tensor of 34359738368 elements is longer than the 8 bytes left"));
  const std::string overflowing = tensor_record({12884901889, 17179869184}, DType::Float32);
  CHECK_THROWS_WITH((from_archive_bytes<DataError, Tensor>(overflowing, "a tensor")), Catch::Contains("implausible extents"));
  const std::string short_values = tensor_record({4}, DType::Float32) + std::string(12, '\0');  // 3 of the 4 floats
  CHECK_THROWS_WITH((from_archive_bytes<DataError, Tensor>(short_values, "a tensor")), Catch::Contains("4 elements is longer than the 12 bytes left"));
}

TEST_CASE("records written on a big-endian machine decode", "[train][checkpoint]") {
  const std::map<std::string, std::vector<float>> values{{"a", {1.5f, -2.0f}}, {"bias", {}}, {"c", {3e-8f}}};
  std::ostringstream out;
  {
    cereal::PortableBinaryOutputArchive archive(out, cereal::PortableBinaryOutputArchive::Options::BigEndian());
    archive(values);
  }
  CHECK((from_archive_bytes<DataError, std::map<std::string, std::vector<float>>>(out.str(), "big-endian")) == values);
  CHECK((from_archive_bytes<DataError, std::map<std::string, std::vector<float>>>(to_archive_bytes(values), "native")) == values);
}
