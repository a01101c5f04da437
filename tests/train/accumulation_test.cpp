// Gradient accumulation on every strategy against one process at the accumulated batch, and the
// gradient-ready announcements of backward() that overlapped strategies start from.
#include <catch2/catch.hpp>
#include <map>

#include "cohort/optim/sgd.hpp"
#include "cohort/train/ring_allreduce.hpp"
#include "ps/ps_test_util.hpp"

using namespace cohort;
using ps_test::momentum_sgd;
using ps_test::require_same_variables;
using ps_test::small_model;

namespace {

// 44 samples: updates of 32 and, at each epoch's end, of the 12 left (shared unevenly among replicas).
const auto kSet = data::make_synthetic({.samples = 44, .sample_shape = {8, 8, 2}, .classes = 4, .seed = 3});

train::FitOptions fit_at(std::int64_t batch_size, std::int64_t accumulate_steps) {
  train::FitOptions options;
  options.epochs = 2;
  options.batch_size = batch_size;
  options.accumulate_steps = accumulate_steps;
  options.seed = 4;
  options.verbosity = train::Verbosity::Silent;
  return options;
}

// One process at batch 32: 2 epochs of 2 updates each.
nn::Sequential reference_run(bool batch_norm = false) {
  nn::Sequential model = small_model(batch_norm);
  Trainer trainer(model, momentum_sgd());
  trainer.fit(kSet, fit_at(32, 1));
  REQUIRE(trainer.optimizer().iterations() == 4);
  return model;
}

}  // namespace

TEST_CASE("accumulating 4 passes of 8 equals steps of 32 on one process, the epoch's rest in a smaller update", "[train][accumulation]") {
  const nn::Sequential reference = reference_run();
  nn::Sequential model = small_model();
  Trainer trainer(model, momentum_sgd());
  const auto history = trainer.fit(kSet, fit_at(8, 4));
  CHECK(trainer.optimizer().iterations() == 4);
  CHECK(history.epochs.size() == 2);
  require_same_variables(reference, model);

  SECTION("max_steps counts updates") {
    nn::Sequential limited = small_model();
    Trainer limited_trainer(limited, momentum_sgd());
    auto options = fit_at(8, 4);
    options.max_steps = 3;
    limited_trainer.fit(kSet, options);
    CHECK(limited_trainer.optimizer().iterations() == 3);
  }
}

TEST_CASE("accumulation under ring allreduce: 2 ranks x 4 passes of 4 equal one process at 32", "[train][accumulation][distributed]") {
  const nn::Sequential reference = reference_run();
  comm::InProcessGroup group(2);
  std::vector<nn::Sequential> models;
  models.push_back(small_model());
  models.push_back(small_model());
  comm_test::run_ranks(2, [&](int r) {
    Trainer trainer(models[static_cast<std::size_t>(r)], momentum_sgd(), std::make_shared<train::RingAllreduce>(group.transport(r)));
    trainer.fit(kSet, fit_at(4, 4));
    CHECK(trainer.optimizer().iterations() == 4);
  });
  for (const auto& model : models) require_same_variables(reference, model);
}

TEST_CASE("accumulation under parameter servers: 2 workers x 4 passes of 4 equal one process at 32", "[train][accumulation][ps]") {
  const nn::Sequential reference = reference_run();
  comm::InProcessGroup group(3);
  std::vector<nn::Sequential> models;
  for (int r = 0; r < 3; ++r) models.push_back(small_model());
  ps_test::run_cluster(group, 2, 1, {}, [&](int r, auto strategy) {
    Trainer trainer(models[static_cast<std::size_t>(r)], momentum_sgd(), strategy);
    trainer.fit(kSet, fit_at(4, 4));
  });
  require_same_variables(reference, models[0]);
  require_same_variables(reference, models[1]);
}

TEST_CASE("with accumulation each pass moves BatchNormalization's moving statistics once", "[train][accumulation]") {
  // A first-layer BatchNormalization sees the data whatever the weights: k passes with accumulation and k
  // steps without move its statistics identically.
  const auto model_with_input_norm = [] {
    nn::Sequential model({8, 8, 2}, 5);
    model.add(nn::BatchNormalization()).add(nn::Conv2D(4, 3)).add(nn::ReLU());
    model.add(nn::Flatten()).add(nn::Dense(4)).add(nn::Softmax());
    return model;
  };
  nn::Sequential stepped = model_with_input_norm(), accumulated = model_with_input_norm();
  Trainer stepped_trainer(stepped, momentum_sgd());
  stepped_trainer.fit(kSet, fit_at(8, 1));
  Trainer accumulated_trainer(accumulated, momentum_sgd());
  accumulated_trainer.fit(kSet, fit_at(8, 3));
  CHECK(stepped_trainer.optimizer().iterations() == 12);
  CHECK(accumulated_trainer.optimizer().iterations() == 4);  // 6 passes per epoch: 2 updates of 3
  for (const char* name : {"batch_normalization/moving_mean", "batch_normalization/moving_variance"}) {
    const auto want = stepped.variable(name)->value.to_vector();
    const auto have = accumulated.variable(name)->value.to_vector();
    for (std::size_t i = 0; i < want.size(); ++i) CHECK(have[i] == Approx(want[i]).epsilon(1e-5));
  }
}

TEST_CASE("accumulate_steps below 1 is refused", "[train][accumulation]") {
  nn::Sequential model = small_model();
  Trainer trainer(model, momentum_sgd());
  CHECK_THROWS_WITH(trainer.fit(kSet, fit_at(8, 0)), Catch::Contains("accumulate_steps must be at least 1"));
}

TEST_CASE("backward announces each layer's trainable variables once, from the last layer back", "[train][nn]") {
  nn::Sequential model = small_model(true);  // batch_normalization + relu run as one group
  model.train();
  const auto set = data::make_synthetic({.samples = 4, .sample_shape = {8, 8, 2}, .classes = 4, .seed = 1});
  const Tensor images({4, 8, 8, 2});
  for (std::int64_t i = 0; i < 4; ++i) set.load(i, images.data() + i * 128);
  const Tensor output = model.forward(images);
  const Tensor gradient = Tensor::full(output.shape(), 0.25f);
  std::vector<std::string> announced;
  std::map<std::string, std::vector<float>> when_announced;
  model.backward(gradient, [&](std::span<const nn::VariablePtr> ready) {
    for (const auto& v : ready) {
      announced.push_back(v->name);
      when_announced[v->name] = v->gradient.to_vector();
    }
  });
  CHECK(announced == std::vector<std::string>{"dense/kernel", "dense/bias", "batch_normalization/gamma",
                                              "batch_normalization/beta", "conv2d/kernel", "conv2d/bias"});
  // Final when announced: what the whole backward() leaves.
  for (const auto& v : model.trainable_variables()) CHECK(when_announced.at(v->name) == v->gradient.to_vector());
}
