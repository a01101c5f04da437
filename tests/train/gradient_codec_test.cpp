// Gradient codecs under ring allreduce: PowerSGD against plain allreduce, and a codec of the caller's own.
#include <catch2/catch.hpp>

#include <atomic>

#include "cohort/comm/inproc.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/synthetic.hpp"
#include "cohort/nn/activation_layer.hpp"
#include "cohort/nn/conv2d.hpp"
#include "cohort/nn/dense.hpp"
#include "cohort/nn/flatten.hpp"
#include "cohort/nn/pooling2d.hpp"
#include "cohort/optim/sgd.hpp"
#include "cohort/train/gradient_codec.hpp"
#include "cohort/train/ring_allreduce.hpp"
#include "cohort/train/trainer.hpp"
#include "comm/comm_test_util.hpp"
#include "ps/ps_test_util.hpp"

using namespace cohort;

namespace {

// Gradient matrices of 18 x 4 (the kernel), 64 x 16 and 16 x 3, and three biases.
nn::Sequential codec_model() {
  nn::Sequential model({8, 8, 2}, 5);
  model.add(nn::Conv2D(4, 3, nn::Padding::Same)).add(nn::ReLU()).add(nn::MaxPooling2D(2)).add(nn::Flatten());
  model.add(nn::Dense(16)).add(nn::ReLU()).add(nn::Dense(3)).add(nn::Softmax());
  return model;
}

const data::ImageDataset& codec_set() {
  static const auto set = data::make_synthetic({.samples = 96, .sample_shape = {8, 8, 2}, .classes = 3, .seed = 11});
  return set;
}

struct Run {
  std::vector<nn::Sequential> models;
  train::History history;  // the chief's
  train::RingAllreduce::GradientTraffic traffic;
};

Run train_two(train::RingAllreduceOptions options, train::FitOptions fit) {
  comm::InProcessGroup group(2);
  Run run;
  run.models.push_back(codec_model());
  run.models.push_back(codec_model());
  fit.verbosity = train::Verbosity::Silent;
  comm_test::run_ranks(2, [&](int r) {
    auto strategy = std::make_shared<train::RingAllreduce>(group.transport(r), options);
    Trainer trainer(run.models[static_cast<std::size_t>(r)], ps_test::momentum_sgd(), strategy);
    auto history = trainer.fit(codec_set(), fit);
    if (r == 0) run.history = std::move(history), run.traffic = strategy->gradient_traffic();
  });
  return run;
}

void require_identical_replicas(const Run& run) {
  for (const auto& v : run.models[0].variables()) {
    INFO(v->name);
    REQUIRE(run.models[1].variable(v->name)->value.to_vector() == v->value.to_vector());
  }
}

// Sums every gradient as it is, counting its calls: a codec of the caller's own.
struct PlainSum {
  std::shared_ptr<std::atomic<int>> calls = std::make_shared<std::atomic<int>>(0);
  std::string name() const { return "plain-sum"; }
  void reduce(std::span<const train::BucketGradient> gradients, train::ReplicaReduction& reduction) {
    ++*calls;
    for (const auto& g : gradients) reduction.sum(g.gradient);
  }
};
static_assert(train::GradientCodecLike<PlainSum>);

}  // namespace

TEST_CASE("PowerSGD at the rank of every gradient matrix takes the steps of plain allreduce", "[train][distributed][codec]") {
  // Rank 16 covers the columns of every matrix: P Q^T is then the whole sum, and error feedback adds nothing
  // to it (the replicas' errors cancel).
  const train::FitOptions fit{.max_steps = 6, .batch_size = 8, .seed = 2};
  const Run plain = train_two({}, fit);
  const Run full = train_two({.codec = train::PowerSgd({.rank = 16, .min_compression = 0})}, fit);
  require_identical_replicas(full);
  ps_test::require_same_variables(plain.models[0], full.models[0], 1e-4);
}

TEST_CASE("PowerSGD at rank 1 sends a fraction of the bytes, keeps the replicas identical and learns", "[train][distributed][codec]") {
  const train::FitOptions fit{.epochs = 8, .batch_size = 8, .seed = 2};
  const Run plain = train_two({}, fit);
  const Run compressed = train_two({.codec = train::PowerSgd({.rank = 1})}, fit);
  require_identical_replicas(compressed);
  CHECK(compressed.traffic.gradient_bytes == plain.traffic.gradient_bytes);
  CHECK(plain.traffic.reduced_bytes == plain.traffic.gradient_bytes);
  // The 64 x 16 kernel sends 80 numbers instead of 1024, the 18 x 4 one 22 of 72; the rest goes whole.
  CHECK(compressed.traffic.reduced_bytes < 0.25 * compressed.traffic.gradient_bytes);
  const double plain_loss = plain.history.epochs.back().at("loss"), compressed_loss = compressed.history.epochs.back().at("loss");
  const double first_loss = compressed.history.epochs.front().at("loss");
  INFO("loss: plain " << plain_loss << ", powersgd:1 " << compressed_loss << " (first epoch " << first_loss << ")");
  CHECK(compressed_loss < 0.6 * first_loss);
  CHECK(compressed_loss < plain_loss + 0.1);
  // Without error feedback the same rank loses what each step's approximation missed.
  const Run forgetful = train_two({.codec = train::PowerSgd({.rank = 1, .error_feedback = false})}, fit);
  CHECK(forgetful.history.epochs.back().at("loss") != compressed_loss);
}

TEST_CASE("a codec of one's own takes every bucket through the concept", "[train][distributed][codec]") {
  const train::FitOptions fit{.max_steps = 5, .batch_size = 8, .seed = 2};
  PlainSum codec;
  const Run own = train_two({.first_bucket_bytes = 0, .bucket_bytes = 0, .codec = codec}, fit);
  const Run plain = train_two({.first_bucket_bytes = 0, .bucket_bytes = 0}, fit);
  // Two replicas add in one order whichever way: the same bits as plain allreduce.
  for (const auto& v : plain.models[0].variables()) {
    INFO(v->name);
    REQUIRE(own.models[0].variable(v->name)->value.to_vector() == v->value.to_vector());
  }
  // 5 steps x 6 buckets (one per variable) x 2 replicas.
  CHECK(*codec.calls == 60);
  comm::InProcessGroup single(1);
  CHECK(train::RingAllreduce(single.transport(0), {.codec = codec}).name() == "ring-allreduce (plain-sum)");
}

TEST_CASE("codecs are refused with sharding, with bfloat16 gradients, by a bad name and when the replicas differ",
          "[train][distributed][codec]") {
  CHECK(train::parse_codec("powersgd").name() == "powersgd:4");
  CHECK(train::parse_codec("powersgd:2").name() == "powersgd:2");
  for (const char* bad : {"powersgd:0", "powersgd:", "powersgd:2x", "power", "bf16"})
    CHECK_THROWS_WITH(train::parse_codec(bad), Catch::Contains("expected powersgd or powersgd:R"));
  CHECK_THROWS_AS(train::PowerSgd({.rank = 0}), InvalidArgument);

  comm::InProcessGroup single(1);
  nn::Sequential model = codec_model();
  auto sgd = ps_test::momentum_sgd();
  // Refused as the strategy is made, before any process connects.
  CHECK_THROWS_WITH(train::RingAllreduce(single.transport(0), {.zero_stage = 1, .codec = train::PowerSgd()}),
                    Catch::Contains("the gradient codec powersgd:4 takes float32 gradients without sharding"));
  CHECK_THROWS_AS(train::RingAllreduce(single.transport(0), {.gradient_dtype = DType::BFloat16, .codec = train::PowerSgd()}),
                  InvalidArgument);

  comm::InProcessGroup group(2);
  std::vector<std::string> errors(2);
  comm_test::run_ranks(2, [&](int r) {
    nn::Sequential replica = codec_model();
    auto own = ps_test::momentum_sgd();
    train::RingAllreduce ring(group.transport(r), {.codec = train::PowerSgd({.rank = r + 1})});
    try {
      ring.initialize(replica, own);
    } catch (const InvalidArgument& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  CHECK_THAT(errors[0], Catch::Contains("the replicas disagree on the gradient codec: this one runs powersgd:1"));
  CHECK_THAT(errors[1], Catch::Contains("this one runs powersgd:2"));
}
