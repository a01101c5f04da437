// Sharded updates (ZeRO stages 1 and 2) against plain ring allreduce, and their sharded checkpoints.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "cohort/comm/inproc.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/synthetic.hpp"
#include "cohort/nn/activation_layer.hpp"
#include "cohort/nn/batch_normalization.hpp"
#include "cohort/nn/conv2d.hpp"
#include "cohort/nn/dense.hpp"
#include "cohort/nn/flatten.hpp"
#include "cohort/nn/pooling2d.hpp"
#include "cohort/optim/adam.hpp"
#include "cohort/train/checkpoint.hpp"
#include "cohort/train/ring_allreduce.hpp"
#include "cohort/train/trainer.hpp"
#include "comm/comm_test_util.hpp"
#include "test_util.hpp"

using namespace cohort;

namespace {

// Variables of 72, 4, 4, 4, 192 and 3 elements: lengths that do not divide by 2, 3 or 4, and a bias smaller
// than 4 ranks; with a bucket per variable, some ranks own nothing of several. (A bias right before batch
// normalization would have gradients of rounding noise only, which Adam's steps magnify.)
nn::Sequential sharded_model() {
  nn::Sequential model({8, 8, 2}, 5);
  model.add(nn::Conv2D(4, 3, nn::Padding::Same)).add(nn::ReLU()).add(nn::BatchNormalization()).add(nn::MaxPooling2D(2));
  model.add(nn::Flatten()).add(nn::Dense(3)).add(nn::Softmax());
  return model;
}

optim::Adam adam() { return optim::Adam({.learning_rate = optim::constant(0.01)}); }

const data::ImageDataset& training_set() {
  static const auto set = data::make_synthetic({.samples = 48, .sample_shape = {8, 8, 2}, .classes = 3, .seed = 7});
  return set;
}

struct Run {
  std::vector<nn::Sequential> models;
  std::vector<std::uint64_t> state_bytes;  // each rank's optimizer state at the end
};

// `ranks` replicas at 12 / ranks samples each: the same global batch whatever the rank count.
Run train_on(int ranks, train::RingAllreduceOptions options, train::FitOptions fit) {
  comm::InProcessGroup group(ranks);
  Run run;
  for (int r = 0; r < ranks; ++r) run.models.push_back(sharded_model());
  run.state_bytes.resize(static_cast<std::size_t>(ranks));
  fit.batch_size = 12 / ranks;
  fit.verbosity = train::Verbosity::Silent;
  comm_test::run_ranks(ranks, [&](int r) {
    auto strategy = std::make_shared<train::RingAllreduce>(group.transport(r), options);
    Trainer trainer(run.models[static_cast<std::size_t>(r)], adam(), strategy);
    trainer.fit(training_set(), fit);
    run.state_bytes[static_cast<std::size_t>(r)] = strategy->optimizer_state_bytes();
  });
  return run;
}

void require_close(const nn::Sequential& expected, const nn::Sequential& got) {
  for (const auto& v : expected.variables()) {
    const auto want = v->value.to_vector(), have = got.variable(v->name)->value.to_vector();
    REQUIRE(have.size() == want.size());
    for (std::size_t i = 0; i < have.size(); ++i) {
      INFO(v->name << "[" << i << "]");
      REQUIRE(have[i] == Approx(want[i]).epsilon(1e-5).margin(1e-6));
    }
  }
}

void require_identical(const nn::Sequential& expected, const nn::Sequential& got) {
  for (const auto& v : expected.variables()) {
    INFO(v->name);
    REQUIRE(got.variable(v->name)->value.to_vector() == v->value.to_vector());
  }
}

// The optimizer shard files in `directory`, sorted.
std::vector<std::string> shard_files(const std::filesystem::path& directory) {
  std::vector<std::string> shards;
  for (const auto& entry : std::filesystem::directory_iterator(directory))
    if (entry.path().filename().string().starts_with("optimizer-")) shards.push_back(entry.path().filename().string());
  std::sort(shards.begin(), shards.end());
  return shards;
}

}  // namespace

TEST_CASE("zero1 and zero2 on 1 to 4 ranks take the Adam steps of plain allreduce", "[train][distributed][zero]") {
  // One bucket for every variable, and a bucket per variable (each cut into as many blocks as ranks).
  const std::size_t bucket_bytes = GENERATE(std::size_t{0}, std::size_t{1} << 30);
  for (int ranks : {1, 2, 3, 4}) {
    const train::FitOptions fit{.max_steps = 6, .seed = 3};
    const Run plain = train_on(ranks, {.first_bucket_bytes = bucket_bytes, .bucket_bytes = bucket_bytes}, fit);
    for (int stage : {1, 2}) {
      INFO("ranks " << ranks << " zero" << stage << " bucket_bytes " << bucket_bytes);
      const Run zero = train_on(ranks, {.first_bucket_bytes = bucket_bytes, .bucket_bytes = bucket_bytes, .zero_stage = stage}, fit);
      for (const auto& model : zero.models) require_close(plain.models[0], model);
      for (const auto& model : zero.models) require_identical(zero.models[0], model);
      // The pieces share the elements out: the state of every element once, about 1/ranks of it each.
      std::uint64_t total = 0, most = 0;
      for (auto bytes : zero.state_bytes) total += bytes, most = std::max(most, bytes);
      CHECK(total == plain.state_bytes[0]);
      if (bucket_bytes > 0) CHECK(most <= (plain.state_bytes[0] / 8 + static_cast<std::uint64_t>(ranks) - 1) / ranks * 8);
    }
  }
}

TEST_CASE("a sharded checkpoint of 4 ranks resumes on 2 and on 3 as the same state saved whole does", "[train][distributed][zero]") {
  test_util::ScratchDirectory scratch("zero_checkpoint");
  const auto sharded = scratch.path() / "sharded";
  std::filesystem::create_directories(sharded);
  train_on(4, {.zero_stage = 2}, {.epochs = 1, .seed = 3, .checkpoint_dir = sharded, .checkpoint_every_steps = 1});
  // The shards of the last checkpoint only, after the epoch's 4 steps: the earlier checkpoints' are gone.
  CHECK(shard_files(sharded) == std::vector<std::string>{"optimizer-4.shard-0-of-4", "optimizer-4.shard-1-of-4",
                                                         "optimizer-4.shard-2-of-4", "optimizer-4.shard-3-of-4"});

  // The same state as one whole checkpoint, assembled by a single process.
  const auto whole = scratch.path() / "whole";
  std::filesystem::create_directories(whole);
  {
    nn::Sequential model = sharded_model();
    optim::Adam optimizer = adam();
    const auto position = train::load_checkpoint(sharded / train::kCheckpointFile, model, optimizer);
    CHECK(optimizer.iterations() == 4);
    CHECK(optimizer.state().size() == model.trainable_variables().size());
    train::save_checkpoint(whole / train::kCheckpointFile, model, optimizer, position);
  }
  for (int ranks : {2, 3}) {
    INFO("resumed on " << ranks << " ranks");
    std::vector<Run> resumed;
    for (const std::filesystem::path& from : {sharded, whole}) {
      const auto directory = scratch.path() / fmt::format("resume-{}-{}", ranks, from.filename().string());
      std::filesystem::copy(from, directory);
      resumed.push_back(train_on(ranks, {.zero_stage = 2}, {.epochs = 2, .seed = 3, .checkpoint_dir = directory, .resume = true}));
      // The resumed run's checkpoints replaced the 4 shards with its own.
      std::vector<std::string> expected;
      for (int r = 0; r < ranks; ++r) expected.push_back(fmt::format("optimizer-8.shard-{}-of-{}", r, ranks));
      CHECK(shard_files(directory) == expected);
    }
    for (const auto& model : resumed[0].models) require_identical(resumed[1].models[0], model);
    // And as plain allreduce resumes the whole state: each rank cut its pieces of it right.
    const auto directory = scratch.path() / fmt::format("resume-{}-plain", ranks);
    std::filesystem::copy(whole, directory);
    const Run plain = train_on(ranks, {}, {.epochs = 2, .seed = 3, .checkpoint_dir = directory, .resume = true});
    require_close(plain.models[0], resumed[0].models[0]);
    CHECK(shard_files(directory).empty());
  }
}

TEST_CASE("a sharded checkpoint with a shard missing or damaged is refused by name", "[train][distributed][zero]") {
  test_util::ScratchDirectory scratch("zero_damaged");
  train_on(2, {.zero_stage = 1}, {.max_steps = 2, .seed = 3, .checkpoint_dir = scratch.path()});
  const auto shard = scratch.path() / "optimizer-2.shard-1-of-2";
  REQUIRE(std::filesystem::exists(shard));
  nn::Sequential model = sharded_model();
  optim::Adam optimizer = adam();
  {
    std::fstream file(shard, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-3, std::ios::end);
    file.put('\x5a');
  }
  CHECK_THROWS_AS(train::load_checkpoint(scratch.path() / train::kCheckpointFile, model, optimizer), DataError);
  CHECK_THROWS_WITH(train::load_checkpoint(scratch.path() / train::kCheckpointFile, model, optimizer),
                    Catch::Contains(shard.string()));
  std::filesystem::remove(shard);
  CHECK_THROWS_WITH(train::load_checkpoint(scratch.path() / train::kCheckpointFile, model, optimizer),
                    Catch::Contains(shard.string()));
  CHECK(optimizer.iterations() == 0);
}

TEST_CASE("zero2 refuses bfloat16 gradients, and replicas that shard differently", "[train][distributed][zero]") {
  comm::InProcessGroup single(1);
  CHECK_THROWS_WITH(train::RingAllreduce(single.transport(0), {.gradient_dtype = DType::BFloat16, .zero_stage = 2}),
                    Catch::Contains("zero2 reduce-scatters float32 gradients"));

  comm::InProcessGroup group(2);
  std::vector<std::string> errors(2);
  comm_test::run_ranks(2, [&](int r) {
    nn::Sequential replica = sharded_model();
    optim::Adam own = adam();
    train::RingAllreduce ring(group.transport(r), {.zero_stage = r == 0 ? 2 : 0});
    try {
      ring.initialize(replica, own);
    } catch (const InvalidArgument& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (const auto& error : errors) CHECK_THAT(error, Catch::Contains("the replicas disagree on sharding the optimizer"));
}
