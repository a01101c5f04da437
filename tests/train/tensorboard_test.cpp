// TensorBoard event files, read back by a decoder of the format written here from its specification
// (TFRecord framing with masked CRC-32C, the Event and Summary protocol buffers), independent of the writer.
#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <sys/stat.h>

#include "cohort/comm/inproc.hpp"
#include "cohort/core/error.hpp"
#include "cohort/optim/sgd.hpp"
#include "cohort/train/parameter_server.hpp"
#include "cohort/train/ring_allreduce.hpp"
#include "cohort/train/tensorboard.hpp"
#include "cohort/train/trainer.hpp"
#include "comm/comm_test_util.hpp"
#include "ps/ps_test_util.hpp"
#include "test_util.hpp"
#include "train/event_file.hpp"
#include "train/tiny_cnn.hpp"

using namespace cohort;
using test_util::ScratchDirectory;

namespace {

// CRC-32C bit by bit (polynomial 0x82F63B78, reflected), then TFRecord's mask.
std::uint32_t reference_masked_crc(std::string_view bytes) {
  std::uint32_t crc = 0xffffffffu;
  for (unsigned char byte : bytes) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  crc ^= 0xffffffffu;
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

template <typename T>
T little_endian(std::string_view bytes, std::size_t at) {
  REQUIRE(at + sizeof(T) <= bytes.size());
  T value;
  std::memcpy(&value, bytes.data() + at, sizeof(T));
  return value;
}

// The records of an event file, each checked against its two masked CRCs.
std::vector<std::string> records_of(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string file = buffer.str();
  std::vector<std::string> records;
  for (std::size_t at = 0; at < file.size();) {
    const auto length = little_endian<std::uint64_t>(file, at);
    CHECK(little_endian<std::uint32_t>(file, at + 8) == reference_masked_crc(std::string_view(file).substr(at, 8)));
    REQUIRE(at + 12 + length + 4 <= file.size());
    const std::string data = file.substr(at + 12, length);
    CHECK(little_endian<std::uint32_t>(file, at + 12 + length) == reference_masked_crc(data));
    records.push_back(data);
    at += 12 + length + 4;
  }
  return records;
}

// A protocol-buffer message as its fields: numbers to values (varints as integers, fixed as raw bytes).
struct Field {
  std::uint64_t varint = 0;
  std::string bytes;
};
std::multimap<std::uint32_t, Field> fields_of(std::string_view message) {
  std::multimap<std::uint32_t, Field> fields;
  std::size_t at = 0;
  const auto varint = [&] {
    std::uint64_t value = 0;
    for (int shift = 0;; shift += 7) {
      REQUIRE(at < message.size());
      const auto byte = static_cast<unsigned char>(message[at++]);
      value |= std::uint64_t{byte & 0x7fu} << shift;
      if ((byte & 0x80u) == 0) return value;
    }
  };
  while (at < message.size()) {
    const std::uint64_t key = varint();
    Field field;
    switch (key & 7) {
      case 0: field.varint = varint(); break;
      case 1: field.bytes = std::string(message.substr(at, 8)); at += 8; break;
      case 5: field.bytes = std::string(message.substr(at, 4)); at += 4; break;
      case 2: {
        const std::uint64_t length = varint();
        field.bytes = std::string(message.substr(at, length));
        at += length;
        break;
      }
      default: FAIL("wire type " << (key & 7));
    }
    fields.emplace(static_cast<std::uint32_t>(key >> 3), field);
  }
  return fields;
}

struct Decoded {
  std::string tag;
  std::int64_t step = 0;
  std::optional<float> scalar;
  std::map<std::uint32_t, std::vector<double>> histogram;  // field number -> doubles (packed or single)
};

// Summary events, after the file-version event that must come first.
std::vector<Decoded> events_of(const std::filesystem::path& path) {
  const auto records = records_of(path);
  REQUIRE(!records.empty());
  const auto version = fields_of(records[0]);
  REQUIRE(version.count(3) == 1);
  CHECK(version.find(3)->second.bytes == "brain.Event:2");
  std::vector<Decoded> out;
  for (std::size_t i = 1; i < records.size(); ++i) {
    const auto event = fields_of(records[i]);
    REQUIRE(event.count(1) == 1);  // wall_time
    REQUIRE(event.count(5) == 1);
    Decoded decoded;
    decoded.step = event.count(2) ? static_cast<std::int64_t>(event.find(2)->second.varint) : 0;
    const auto summary = fields_of(event.find(5)->second.bytes);
    REQUIRE(summary.count(1) == 1);
    const auto value = fields_of(summary.find(1)->second.bytes);
    decoded.tag = value.find(1)->second.bytes;
    if (value.count(2)) decoded.scalar = little_endian<float>(value.find(2)->second.bytes, 0);
    if (value.count(5))
      for (const auto& [number, field] : fields_of(value.find(5)->second.bytes))
        for (std::size_t at = 0; at + 8 <= field.bytes.size(); at += 8)
          decoded.histogram[number].push_back(little_endian<double>(field.bytes, at));
    out.push_back(decoded);
  }
  return out;
}

std::filesystem::path only_event_file(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) files.push_back(entry.path());
  REQUIRE(files.size() == 1);
  CHECK(files[0].filename().string().starts_with("events.out.tfevents."));
  return files[0];
}

}  // namespace

TEST_CASE("TensorBoard records are framed with masked CRC-32C", "[train][tensorboard]") {
  // The mask of CRC-32C("123456789") = 0xE3069283, rotated right by 15 and offset.
  CHECK(train::masked_crc32c("123456789") == ((0xe3069283u >> 15 | 0xe3069283u << 17) + 0xa282ead8u));
  CHECK(train::masked_crc32c("a record") == reference_masked_crc("a record"));
  const std::string record = train::tfrecord("payload");
  REQUIRE(record.size() == 8 + 4 + 7 + 4);
  CHECK(little_endian<std::uint64_t>(record, 0) == 7);
  CHECK(record.substr(12, 7) == "payload");
}

TEST_CASE("the TensorBoard callback writes the run's curves and histograms as Keras lays them out", "[train][tensorboard]") {
  ScratchDirectory dir("tensorboard");
  nn::Sequential model = train_test::tiny_cnn();
  Trainer trainer(model, optim::SGD());
  train::FitOptions fit{.epochs = 2, .batch_size = 32, .validation = &train_test::synthetic_set(),
                        .verbosity = train::Verbosity::Silent};
  fit.callbacks.push_back(std::make_shared<train::TensorBoard>(
      train::TensorBoardOptions{.log_dir = dir.path() / "logs", .update_every_steps = 5}));
  const auto history = trainer.fit(train_test::synthetic_set(), fit);

  const auto train_events = events_of(only_event_file(dir.path() / "logs" / "train"));
  const auto validation_events = events_of(only_event_file(dir.path() / "logs" / "validation"));
  const auto scalar = [](const std::vector<Decoded>& events, const std::string& tag, std::int64_t step) -> std::optional<float> {
    for (const auto& e : events)
      if (e.tag == tag && e.step == step && e.scalar) return e.scalar;
    return std::nullopt;
  };
  for (std::int64_t epoch = 0; epoch < 2; ++epoch) {
    const auto& logs = history.epochs[static_cast<std::size_t>(epoch)];
    INFO("epoch " << epoch);
    CHECK(scalar(train_events, "epoch_loss", epoch) == static_cast<float>(logs.at("loss")));
    CHECK(scalar(train_events, "epoch_accuracy", epoch) == static_cast<float>(logs.at("accuracy")));
    CHECK(scalar(train_events, "epoch_learning_rate", epoch) == static_cast<float>(logs.at("learning_rate")));
    CHECK(scalar(validation_events, "epoch_loss", epoch) == static_cast<float>(logs.at("val_loss")));
    CHECK(scalar(validation_events, "epoch_accuracy", epoch) == static_cast<float>(logs.at("val_accuracy")));
    CHECK_FALSE(scalar(train_events, "epoch_val_loss", epoch));
  }
  // 600 samples at batch 32: 19 steps an epoch, batch scalars at steps 5, 10, ..., 35.
  std::vector<std::int64_t> batch_steps;
  for (const auto& e : train_events)
    if (e.tag == "batch_loss") batch_steps.push_back(e.step);
  CHECK(batch_steps == std::vector<std::int64_t>{5, 10, 15, 20, 25, 30, 35});
  // Every N steps also the rate and the throughput so far in the epoch.
  CHECK(scalar(train_events, "batch_learning_rate", 25) == static_cast<float>(trainer.optimizer().learning_rate()));
  CHECK(scalar(train_events, "batch_samples_per_second", 25) > 0.0f);

  // A histogram per variable and epoch, counting every value, its buckets summing to the count.
  for (const auto& variable : model.variables()) {
    INFO(variable->name);
    const auto values = variable->value.to_vector();
    const auto histogram = std::find_if(train_events.rbegin(), train_events.rend(), [&](const Decoded& e) {
      return e.tag == variable->name && e.step == 1 && !e.histogram.empty();
    });
    REQUIRE(histogram != train_events.rend());
    const auto& h = histogram->histogram;
    CHECK(h.at(3)[0] == static_cast<double>(values.size()));
    CHECK(h.at(1)[0] == *std::min_element(values.begin(), values.end()));
    CHECK(h.at(2)[0] == *std::max_element(values.begin(), values.end()));
    double counted = 0;
    for (double c : h.at(7)) counted += c;
    CHECK(counted == static_cast<double>(values.size()));
    CHECK(h.at(6).size() == h.at(7).size());
  }
}

TEST_CASE("a TensorBoard directory that cannot be made fails before training, naming it", "[train][tensorboard]") {
  ScratchDirectory dir("tensorboard_unwritable");
  const auto file = dir.path() / "a file";
  std::ofstream(file) << "x";
  nn::Sequential model = train_test::tiny_cnn();
  Trainer trainer(model, optim::SGD());
  train::FitOptions fit{.epochs = 1, .verbosity = train::Verbosity::Silent};
  fit.callbacks.push_back(std::make_shared<train::TensorBoard>(train::TensorBoardOptions{.log_dir = file / "logs"}));
  CHECK_THROWS_AS(trainer.fit(train_test::synthetic_set(), fit), IoError);
  CHECK_THROWS_WITH(trainer.fit(train_test::synthetic_set(), fit), Catch::Contains((file / "logs" / "train").string()));
  CHECK(trainer.optimizer().iterations() == 0);
}

TEST_CASE("in a distributed run the chief writes the job's curves, or every process its own", "[train][tensorboard]") {
  for (const bool every_process : {false, true}) {
    INFO((every_process ? "every process" : "the chief's"));
    ScratchDirectory dir("tensorboard_distributed");
    comm::InProcessGroup group(2, std::chrono::seconds(30), {"chief 0", "worker 0"});
    comm_test::run_ranks(2, [&](int r) {
      nn::Sequential model = train_test::tiny_cnn();
      Trainer trainer(model, optim::SGD(), std::make_shared<train::RingAllreduce>(group.transport(r)));
      train::FitOptions fit{.epochs = 1, .batch_size = 32, .verbosity = train::Verbosity::Silent};
      fit.callbacks.push_back(std::make_shared<train::TensorBoard>(
          train::TensorBoardOptions{.log_dir = dir.path(), .update_every_steps = 2, .every_process = every_process}));
      trainer.fit(train_test::synthetic_set(), fit);
    });
    std::set<std::string> written;
    for (const auto& entry : std::filesystem::recursive_directory_iterator(dir.path()))
      if (entry.is_regular_file()) written.insert(std::filesystem::relative(entry.path().parent_path(), dir.path()).string());
    if (every_process) {
      CHECK(written == std::set<std::string>{"chief-0/train", "chief-0/validation", "worker-0/train", "worker-0/validation"});
      // The epoch logs are the job's, the same on both.
      const auto loss_of = [&](const std::string& process) {
        for (const auto& e : events_of(only_event_file(dir.path() / process / "train")))
          if (e.tag == "epoch_loss") return *e.scalar;
        FAIL("no epoch_loss for " << process);
        return 0.0f;
      };
      CHECK(loss_of("chief-0") == loss_of("worker-0"));
      const auto events = events_of(only_event_file(dir.path() / "chief-0" / "train"));
      CHECK(std::any_of(events.begin(), events.end(), [](const Decoded& e) { return e.tag == "epoch_comm_seconds" && *e.scalar >= 0; }));
    } else {
      CHECK(written == std::set<std::string>{"train", "validation"});
      only_event_file(dir.path() / "train");  // one writer, not one per process
    }
  }
}

TEST_CASE("a parameter-server job's curves hold each server's bytes and request latency per epoch", "[train][tensorboard]") {
  ScratchDirectory dir("tensorboard_ps");
  comm::InProcessGroup group(4, std::chrono::seconds(30), ps_test::process_names(2, 2));
  std::vector<train::History> histories(2);
  std::int64_t model_bytes = 0;
  ps_test::run_cluster(group, 2, 2, {}, [&](int r, auto strategy) {
    nn::Sequential model = train_test::tiny_cnn();
    Trainer trainer(model, optim::SGD(), strategy);
    train::FitOptions fit{.epochs = 2, .batch_size = 16, .verbosity = train::Verbosity::Silent};
    fit.callbacks.push_back(std::make_shared<train::TensorBoard>(train::TensorBoardOptions{.log_dir = dir.path()}));
    auto history = trainer.fit(train_test::synthetic_set(), fit);
    if (r >= 2) return;
    histories[static_cast<std::size_t>(r)] = std::move(history);
    if (r == 0)
      for (const auto& variable : model.variables()) model_bytes += variable->value.numel() * 4;
  });
  CHECK(histories[0].epochs == histories[1].epochs);
  const auto events = events_of(only_event_file(dir.path() / "train"));
  const auto scalar = [&](const std::string& tag, std::int64_t step) -> std::optional<float> {
    for (const auto& e : events)
      if (e.tag == tag && e.step == step && e.scalar) return e.scalar;
    return std::nullopt;
  };
  // 600 samples over 2 workers at batch 16: 19 steps each an epoch, each pushing every gradient and
  // reading every value back, float32 both ways.
  const double expected_megabytes = 2 * 19 * 2 * static_cast<double>(model_bytes) / 1e6;
  for (std::int64_t epoch = 0; epoch < 2; ++epoch) {
    const auto& logs = histories[0].epochs[static_cast<std::size_t>(epoch)];
    INFO("epoch " << epoch);
    double megabytes = 0;
    for (std::size_t server = 0; server < 2; ++server) {
      const std::string bytes_log = train::server_log(server, "megabytes"), latency_log = train::server_log(server, "latency_ms");
      INFO(bytes_log);
      REQUIRE(logs.contains(bytes_log));
      CHECK(logs.at(bytes_log) > 0);
      CHECK(logs.at(latency_log) > 0);
      CHECK(scalar("epoch_" + bytes_log, epoch) == static_cast<float>(logs.at(bytes_log)));
      CHECK(scalar("epoch_" + latency_log, epoch) == static_cast<float>(logs.at(latency_log)));
      megabytes += logs.at(bytes_log);
    }
    // Message headers add the rest (a few hundred bytes a step beside 2,800 of values), and the first
    // epoch carries the chief's initial values and both workers' first reads; one direction or one
    // worker alone would be half.
    CHECK(megabytes >= expected_megabytes);
    CHECK(megabytes <= expected_megabytes * 1.3);
    CHECK(logs.at("data_seconds") >= 0);
    CHECK(logs.at("data_seconds") < logs.at("seconds"));
  }
}
