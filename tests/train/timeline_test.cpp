// The timeline: Chrome traces written and merged, and what they show of a training step: the allreduce of
// gradient buckets, and a parameter server's request, starting while backward still runs.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <nlohmann/json.hpp>
#include <thread>

#include "cohort/comm/communicator.hpp"
#include "cohort/comm/inproc.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/timeline.hpp"
#include "cohort/optim/sgd.hpp"
#include "cohort/train/ring_allreduce.hpp"
#include "ps/ps_test_util.hpp"

using namespace cohort;
using nlohmann::json;

namespace {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& name) : path(std::filesystem::temp_directory_path() / (name + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  REQUIRE(in);
  return json::parse(in);
}

// The complete events of category `category` on the track named `thread`.
std::vector<json> events_of(const json& trace, const std::string& category, const std::string& thread) {
  int track = -1;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name" && e["args"]["name"] == thread) track = e["tid"].get<int>();
  std::vector<json> found;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X" && e["cat"] == category && e["tid"].get<int>() == track) found.push_back(e);
  return found;
}

// A placement of the test's own: the dense layer on server 1, the rest on server 0.
struct DenseApart {
  std::string name() const { return "dense apart"; }
  std::vector<int> assign(const std::vector<ps::Shard>& shards, int) const {
    std::vector<int> servers;
    for (const auto& shard : shards) servers.push_back(shard.variable.starts_with("dense") ? 1 : 0);
    return servers;
  }
};

std::int64_t end_of(const json& event) { return event["ts"].get<std::int64_t>() + event["dur"].get<std::int64_t>(); }

// Convolutions large enough that the backward passes after the dense layer's take milliseconds: the
// communicator's thread has time to start the dense layer's bucket even on a loaded machine.
nn::Sequential overlap_model() {
  nn::Sequential model({24, 24, 3}, 5);
  model.add(nn::Conv2D(16, 3, nn::Padding::Same)).add(nn::BatchNormalization()).add(nn::ReLU());
  model.add(nn::Conv2D(16, 3, nn::Padding::Same)).add(nn::ReLU()).add(nn::MaxPooling2D(2));
  model.add(nn::Flatten()).add(nn::Dense(4)).add(nn::Softmax());
  return model;
}

}  // namespace

TEST_CASE("a timeline holds spans per thread as a Chrome trace, merged, a track per process", "[train][timeline]") {
  const TempDir dir("cohort_timeline_");
  timeline::Span before("forward", "not recorded");  // made before recording: records nothing
  timeline::start("rank 3");
  {
    const timeline::Span span("forward", "dense");
    std::thread([] {
      timeline::name_this_thread("helper");
      const timeline::Span inner("communication", "allreduce");
    }).join();
  }
  timeline::stop_and_write(dir.path / "a.json", dir.path / "merged.json");
  const json trace = read_json(dir.path / "a.json");
  REQUIRE(events_of(trace, "forward", "main").size() == 1);
  CHECK(events_of(trace, "forward", "main")[0]["name"] == "dense");
  CHECK(events_of(trace, "communication", "helper").size() == 1);
  CHECK(trace["otherData"]["merge_into"] == (dir.path / "merged.json").string());
  bool named = false;
  for (const auto& e : trace["traceEvents"]) named = named || (e["name"] == "process_name" && e["args"]["name"] == "rank 3");
  CHECK(named);
  CHECK_FALSE(timeline::recording());

  std::filesystem::copy_file(dir.path / "a.json", dir.path / "b.json");
  std::ofstream(dir.path / "c.json") << "{\"traceEvents\": [";  // cut short: left out, the others merged
  const auto report = timeline::merge_directory(dir.path);
  CHECK(report.written == std::vector{dir.path / "merged.json"});
  REQUIRE(report.problems.size() == 1);
  CHECK_THAT(report.problems[0], Catch::Contains("c.json is not a timeline written by cohort"));
  const json merged = read_json(dir.path / "merged.json");
  std::set<int> pids;
  for (const auto& e : merged["traceEvents"]) pids.insert(e["pid"].get<int>());
  CHECK(pids == std::set<int>{0, 1});

  std::ofstream(dir.path / "garbage.json") << "{\"traceEvents\": [1, 2";
  CHECK_THROWS_AS(timeline::merge({dir.path / "garbage.json"}, dir.path / "out.json"), DataError);
  CHECK_THROWS_WITH(timeline::merge({dir.path / "garbage.json"}, dir.path / "out.json"), Catch::Contains("garbage.json"));
  std::filesystem::remove(dir.path / "garbage.json");
  std::filesystem::remove(dir.path / "c.json");
  std::ofstream(dir.path / "no_destination.json") << "{\"traceEvents\": []}";
  CHECK_THAT(timeline::merge_directory(dir.path).problems.at(0), Catch::Contains("does not say which file"));

  // Special files are refused, not replaced; a symbolic link is written through.
  CHECK_THROWS_WITH(timeline::check_writable("/dev/null"), Catch::Contains("not a regular file"));
  CHECK_THROWS_WITH(timeline::check_writable(dir.path), Catch::Contains("not a regular file"));
  std::filesystem::create_symlink(dir.path / "target.json", dir.path / "link.json");
  timeline::start("rank 0");
  timeline::stop_and_write(dir.path / "link.json");
  CHECK(std::filesystem::is_symlink(dir.path / "link.json"));
  CHECK(read_json(dir.path / "target.json").contains("traceEvents"));
}

TEST_CASE("a collective that waits for its device to write the buffer shows the wait on the communicator's track",
          "[train][timeline]") {
  // The point is passed 20 ms after the collective is started, as the rest of a backward pass would take.
  struct Later final : DeviceEvent {
    std::chrono::steady_clock::time_point at = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
    bool finished() const override { return std::chrono::steady_clock::now() >= at; }
  };
  const TempDir dir("cohort_timeline_device_wait_");
  comm::InProcessGroup group(1);
  auto communicator = comm::make_ring_communicator(group.transport(0));
  std::vector<float> values(16, 1.0f);
  comm::Buffer waiting = comm::Buffer::of(values), ready = comm::Buffer::of(values);
  waiting.ready = std::make_shared<Later>();
  timeline::start("rank 0");
  communicator->allreduce(waiting, comm::ReduceOp::Sum)->wait(std::chrono::seconds(5));
  communicator->allreduce(ready, comm::ReduceOp::Sum)->wait(std::chrono::seconds(5));
  timeline::stop_and_write(dir.path / "device_wait.json");
  const json trace = read_json(dir.path / "device_wait.json");
  const auto waits = events_of(trace, "device", "ring communicator");
  REQUIRE(waits.size() == 1);  // the buffer that was there at once waited for nothing
  CHECK_THAT(waits[0]["name"].get<std::string>(), Catch::Contains("allreduce of 64 bytes: waiting for the device to write its buffer"));
  CHECK(waits[0]["dur"].get<std::int64_t>() >= 10000);
  CHECK(events_of(trace, "communication", "ring communicator").size() == 2);
}

TEST_CASE("the timeline shows a bucket's allreduce starting before backward ends, one bucket for all after it", "[train][timeline][distributed]") {
  const TempDir dir("cohort_timeline_overlap_");
  const auto set = data::make_synthetic({.samples = 96, .sample_shape = {24, 24, 3}, .classes = 4, .seed = 3});
  constexpr int kSteps = 3;
  for (const bool buckets_per_variable : {true, false}) {
    INFO("a bucket per variable: " << buckets_per_variable);
    // One rank, so that every communication event on the timeline is this trainer's.
    comm::InProcessGroup group(1);
    const train::RingAllreduceOptions options =
        buckets_per_variable ? train::RingAllreduceOptions{.first_bucket_bytes = 0, .bucket_bytes = 0}
                             : train::RingAllreduceOptions{.first_bucket_bytes = 1 << 30, .bucket_bytes = 1 << 30};
    nn::Sequential model = overlap_model();
    Trainer trainer(model, optim::SGD(), std::make_shared<train::RingAllreduce>(group.transport(0), options));
    train::FitOptions fit;
    fit.max_steps = kSteps;
    fit.batch_size = 32;
    fit.verbosity = train::Verbosity::Silent;
    fit.timeline = dir.path / "trace.json";
    trainer.fit(set, fit);
    const json trace = read_json(dir.path / "trace.rank-0.json");  // a process of a distributed strategy

    const auto updates = events_of(trace, "update", "main");
    REQUIRE(updates.size() == kSteps);
    const auto backwards = events_of(trace, "backward", "main");
    const auto collectives = events_of(trace, "communication", "ring communicator");
    // Per step (from the previous update's end to this one's start): the end of backward and the start of
    // the first allreduce.
    int overlapped_steps = 0;
    for (int step = 0; step < kSteps; ++step) {
      const std::int64_t step_begin = step == 0 ? 0 : end_of(updates[step - 1]);
      const std::int64_t step_end = updates[step]["ts"].get<std::int64_t>();
      std::int64_t backward_end = 0, first_allreduce = std::numeric_limits<std::int64_t>::max();
      for (const auto& e : backwards)
        if (e["ts"] >= step_begin && e["ts"] < step_end) backward_end = std::max(backward_end, end_of(e));
      for (const auto& e : collectives)
        if (e["ts"] >= step_begin && e["ts"] < step_end && e["name"].get<std::string>().find("allreduce of") != std::string::npos)
          first_allreduce = std::min(first_allreduce, e["ts"].get<std::int64_t>());
      INFO("step " << step << ": backward ends at " << backward_end << " us, the first allreduce starts at " << first_allreduce);
      REQUIRE(backward_end > 0);
      REQUIRE(first_allreduce < step_end);
      // One bucket for all can only start once the first layer's gradients exist, after every backward.
      if (!buckets_per_variable) CHECK(first_allreduce >= backward_end);
      overlapped_steps += first_allreduce < backward_end ? 1 : 0;
    }
    // Starting a bucket during backward depends on the communicator's thread being scheduled in time: one
    // step of three suffices.
    if (buckets_per_variable) CHECK(overlapped_steps >= 1);
    CHECK(events_of(trace, "communication", "main").size() == kSteps);  // the waits for the allreduce
    CHECK(events_of(trace, "data", "main").size() >= kSteps);
  }
}

TEST_CASE("parameter servers: a server's request leaves while backward still runs", "[train][timeline][ps]") {
  const TempDir dir("cohort_timeline_ps_");
  const auto set = data::make_synthetic({.samples = 64, .sample_shape = {8, 8, 2}, .classes = 4, .seed = 3});
  comm::InProcessGroup group(3);
  std::vector<nn::Sequential> models;
  for (int r = 0; r < 3; ++r) models.push_back(ps_test::small_model(true));
  // The dense layer's variables on a server of their own: its request can leave before conv2d's backward,
  // the last, has run.
  ps_test::run_cluster(group, 1, 2, {.placement = DenseApart{}}, [&](int r, auto strategy) {
    Trainer trainer(models[static_cast<std::size_t>(r)], optim::SGD(), strategy);
    train::FitOptions fit;
    fit.max_steps = 3;
    fit.batch_size = 16;
    fit.verbosity = train::Verbosity::Silent;
    if (r == 0) fit.timeline = dir.path / "trace.json";  // one recorder per process: the worker's
    trainer.fit(set, fit);
  });
  const json trace = read_json(dir.path / "trace.rank-0.json");
  const auto batches = events_of(trace, "data", "main");
  REQUIRE(batches.size() >= 3);
  const std::int64_t step_begin = batches[2]["ts"].get<std::int64_t>();  // the last step
  std::int64_t backward_end = 0, first_push = std::numeric_limits<std::int64_t>::max();
  for (const auto& e : events_of(trace, "backward", "main"))
    if (e["ts"] >= step_begin) backward_end = std::max(backward_end, end_of(e));
  for (const auto& e : events_of(trace, "communication", "main"))
    if (e["ts"] >= step_begin && e["name"] == "push") first_push = std::min(first_push, e["ts"].get<std::int64_t>());
  REQUIRE(backward_end > 0);
  CHECK(first_push < backward_end);
}

TEST_CASE("a timeline that cannot be written is refused before training", "[train][timeline]") {
  const auto set = data::make_synthetic({.samples = 16, .sample_shape = {8, 8, 2}, .classes = 4, .seed = 3});
  nn::Sequential model = ps_test::small_model();
  Trainer trainer(model, optim::SGD());
  train::FitOptions fit;
  fit.verbosity = train::Verbosity::Silent;
  fit.timeline = "/nonexistent-directory/trace.json";
  CHECK_THROWS_WITH(trainer.fit(set, fit), Catch::Contains("cannot write the timeline /nonexistent-directory/trace.json"));
  CHECK_FALSE(timeline::recording());
  CHECK(trainer.optimizer().iterations() == 0);
}
