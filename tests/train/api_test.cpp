// The training API as a Keras or PyTorch user meets it: losses and metrics as options, in-memory data,
// callbacks that act on every process alike, weights files.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <random>

#include "cohort/comm/inproc.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/synthetic.hpp"
#include "cohort/data/tensor_dataset.hpp"
#include "cohort/data/transforms.hpp"
#include "cohort/nn/activation_layer.hpp"
#include "cohort/nn/dense.hpp"
#include "cohort/nn/flatten.hpp"
#include "cohort/nn/model_file.hpp"
#include "cohort/nn/normalization.hpp"
#include "cohort/nn/zoo.hpp"
#include "cohort/nn/weights.hpp"
#include "cohort/optim/adam.hpp"
#include "cohort/optim/sgd.hpp"
#include "cohort/train/parameter_server.hpp"
#include "cohort/train/ring_allreduce.hpp"
#include "cohort/train/trainer.hpp"
#include "comm/comm_test_util.hpp"
#include "test_util.hpp"

using namespace cohort;
using test_util::ScratchDirectory;

namespace {

const data::ImageDataset& three_classes() {
  static const auto set = data::make_synthetic({.samples = 300, .sample_shape = {4, 4, 1}, .classes = 3, .noise = 60});
  return set;
}

nn::Sequential mlp(bool softmax, int classes = 3) {
  nn::Sequential model({4, 4, 1}, 3);
  model.add(nn::Flatten()).add(nn::Dense(16)).add(nn::ReLU()).add(nn::Dense(classes));
  if (softmax) model.add(nn::Softmax());
  return model;
}

train::FitOptions quiet(std::int64_t epochs, const data::Dataset* validation = nullptr) {
  return {.epochs = epochs, .batch_size = 20, .seed = 1, .validation = validation, .verbosity = train::Verbosity::Silent};
}

optim::Adam adam(double rate = 1e-2) { return optim::Adam({.learning_rate = optim::constant(rate)}); }

std::vector<float> all_values(const nn::Sequential& model) {
  std::vector<float> values;
  for (const auto& v : model.variables()) {
    const auto part = v->value.to_vector();
    values.insert(values.end(), part.begin(), part.end());
  }
  return values;
}

// y = 2 a - b + 0.5 over a grid of (a, b).
data::TensorDataset line_set() {
  std::vector<float> inputs, outputs;
  for (int i = 0; i < 100; ++i) {
    const float a = static_cast<float>(i % 10) / 10, b = static_cast<float>(i / 10) / 10;
    inputs.insert(inputs.end(), {a, b});
    outputs.push_back(2 * a - b + 0.5f);
  }
  return data::TensorDataset({2}, inputs, {1}, outputs, "a plane");
}

}  // namespace

TEST_CASE("a model without Softmax trains with from_logits, a loss that does not fit says what to change", "[train][api]") {
  nn::Sequential logits_model = mlp(false);
  Trainer wrong(logits_model, adam());
  CHECK_THROWS_AS(wrong.fit(three_classes(), quiet(1)), InvalidArgument);
  CHECK_THROWS_WITH(wrong.fit(three_classes(), quiet(1)),
                    Catch::Contains("expects probabilities") && Catch::Contains("from_logits = true") &&
                        Catch::Contains("dense_1"));
  nn::Sequential softmax_model = mlp(true);
  Trainer twice(softmax_model, adam(), std::make_shared<train::Local>(), {.loss = nn::CategoricalCrossentropy{.from_logits = true}});
  CHECK_THROWS_WITH(twice.fit(three_classes(), quiet(1)), Catch::Contains("remove the Softmax layer"));

  // The same network with and without its Softmax: the fused and the from_logits paths agree.
  nn::Sequential with_softmax = mlp(true), without = mlp(false);
  Trainer fused(with_softmax, adam());
  Trainer from_logits(without, adam(), std::make_shared<train::Local>(),
                      {.loss = nn::SparseCategoricalCrossentropy{.from_logits = true}});
  const auto a = fused.fit(three_classes(), quiet(3, &three_classes()));
  const auto b = from_logits.fit(three_classes(), quiet(3, &three_classes()));
  for (const char* key : {"loss", "accuracy", "val_loss", "val_accuracy"})
    CHECK(b.epochs.back().at(key) == Approx(a.epochs.back().at(key)).epsilon(1e-5));
  CHECK(b.epochs.back().at("val_accuracy") > 0.9);
  CHECK(b.epochs.back().at("loss") < 0.5);
}

TEST_CASE("regression on in-memory data, binary cross-entropy, top-k accuracy", "[train][api]") {
  const auto plane = line_set();
  CHECK(plane.target_shape() == Shape{1});
  nn::Sequential linear({2}, 1);
  linear.add(nn::Dense(1));
  Trainer regression(linear, adam(0.05), std::make_shared<train::Local>(),
                     {.loss = nn::MeanSquaredError{}, .metrics = {"mae"}});
  const auto history = regression.fit(plane, quiet(60));
  CHECK(history.epochs.back().at("loss") < 1e-3);
  CHECK(history.epochs.back().at("mae") < 0.03);
  CHECK(history.epochs.back().count("accuracy") == 0);
  Trainer no_accuracy(linear, adam(), std::make_shared<train::Local>(), {.loss = nn::MeanSquaredError{}, .metrics = {"accuracy"}});
  CHECK_THROWS_WITH(no_accuracy.fit(plane, quiet(1)), Catch::Contains("accuracy needs classes"));
  const Tensor prediction = regression.predict(Tensor::from_values({1, 2}, std::vector<float>{0.3f, 0.4f}));
  CHECK(prediction.data()[0] == Approx(0.6 - 0.4 + 0.5).margin(0.05));
  const data::TensorDataset nothing({2}, std::vector<float>{}, Shape{1}, std::vector<float>{}, "nothing");
  CHECK_THROWS_WITH(regression.fit(plane, quiet(1, &nothing)), Catch::Contains("empty validation set 'nothing'"));

  // Two classes, one sigmoid output, class indices as targets.
  const auto two = data::make_synthetic({.samples = 200, .sample_shape = {4, 4, 1}, .classes = 2, .noise = 60});
  nn::Sequential binary({4, 4, 1}, 2);
  binary.add(nn::Flatten()).add(nn::Dense(1)).add(nn::Sigmoid());
  Trainer bce(binary, adam(), std::make_shared<train::Local>(), {.loss = nn::BinaryCrossentropy{}});
  CHECK(bce.fit(two, quiet(5)).epochs.back().at("accuracy") > 0.95);
  nn::Sequential three_sigmoids({4, 4, 1}, 2);
  three_sigmoids.add(nn::Flatten()).add(nn::Dense(3)).add(nn::Sigmoid());
  Trainer bce_on_classes(three_sigmoids, adam(), std::make_shared<train::Local>(), {.loss = nn::BinaryCrossentropy{}});
  CHECK_THROWS_WITH(bce_on_classes.fit(three_classes(), quiet(1)),
                    Catch::Contains("needs 2 classes, the data set has 3") && Catch::Contains("use sparse_categorical_crossentropy"));
  // Labels as one float per sample, as Keras users hold them: the message says how to give class indices.
  nn::Sequential two_scores({2}, 2);
  two_scores.add(nn::Dense(2)).add(nn::Softmax());
  Trainer sparse(two_scores, adam(), std::make_shared<train::Local>(), {.loss = nn::SparseCategoricalCrossentropy{}});
  CHECK_THROWS_WITH(sparse.fit(plane, quiet(1)), Catch::Contains("one float target per sample (shape (1))") &&
                                                     Catch::Contains("std::vector<int> labels"));
  CHECK_THROWS_WITH(bce.predict(Tensor::full({4, 4, 1}, 0.0f)),
                    Catch::Contains("samples of shape (4, 4, 1), that is (N, 4, 4, 1) for N samples; got (4, 4, 1)"));

  nn::Sequential model = mlp(true);
  Trainer top_k(model, adam(), std::make_shared<train::Local>(), {.metrics = {"accuracy", "top_2_accuracy", nn::Metric::top_k_accuracy(3)}});
  const train::Logs logs = top_k.fit(three_classes(), quiet(1)).epochs.back();
  CHECK(logs.at("top_2_accuracy") >= logs.at("accuracy"));
  CHECK(logs.at("top_3_accuracy") == 1.0);
  CHECK_THROWS_WITH(nn::Metric("precision"), Catch::Contains("unknown metric 'precision'") && Catch::Contains("top_k_accuracy"));
  CHECK_THROWS_WITH(data::TensorDataset({2}, {1, 2, 3, 4}, std::vector<int>{0, 5}, 2), Catch::Contains("label 5 of sample 1"));
  CHECK_THROWS_WITH(data::TensorDataset({2}, {1, 2, 3}, std::vector<int>{0}, 2), Catch::Contains("do not make whole samples"));
  CHECK_THROWS_WITH(data::TensorDataset({1}, {NAN, 1}, {1}, {1, 2}), Catch::Contains("sample 0 holds nan"));
  CHECK_THROWS_WITH(data::TensorDataset({1}, {0, 1}, {1}, {1, INFINITY}), Catch::Contains("target 1 holds inf"));
}

TEST_CASE("under ring allreduce a callback's stop or learning-rate change takes effect on every rank", "[train][api][distributed]") {
  comm::InProcessGroup group(2, std::chrono::seconds(20), {"chief 0 (h:1)", "worker 0 (h:2)"});
  std::vector<nn::Sequential> models;
  for (int r = 0; r < 2; ++r) models.push_back(mlp(true));
  std::vector<train::History> histories(2);
  std::vector<double> rates(2);
  test_util::CapturedOutput log(STDERR_FILENO);
  comm_test::run_ranks(2, [&](int rank) {
    auto strategy = std::make_shared<train::RingAllreduce>(group.transport(rank));
    Trainer trainer(models[static_cast<std::size_t>(rank)], adam(), strategy);
    auto options = quiet(10, &three_classes());
    auto callback = std::make_shared<train::LambdaCallback>();
    // Only rank 1 changes the rate (after the first epoch); only the chief stops (after the third).
    if (rank == 1)
      callback->epoch_end = [](std::int64_t epoch, const train::Logs&, train::TrainingControl& control) {
        if (epoch == 0) control.set_learning_rate(1e-3);
      };
    if (rank == 0)
      callback->batch_end = [](std::int64_t step, const train::Logs&, train::TrainingControl& control) {
        if (step == 35) control.stop();
      };
    options.callbacks.push_back(callback);
    histories[static_cast<std::size_t>(rank)] = trainer.fit(three_classes(), options);
    rates[static_cast<std::size_t>(rank)] = trainer.optimizer().learning_rate();
  });
  // The chief says who decided what, once.
  const std::string said = log.text();
  INFO(said);
  CHECK(said.find("worker 0 asked for learning rate 0.001 after epoch 1: every process takes it") != std::string::npos);
  CHECK(said.find("chief 0 asked to stop after step 35: every process stops") != std::string::npos);
  CHECK(said.find("asked to stop") == said.rfind("asked to stop"));  // by the chief alone
  // 300 samples, global batch 40: 8 steps per epoch; step 35 is in the fifth epoch.
  REQUIRE(histories[0].epochs.size() == 5);
  REQUIRE(histories[1].epochs.size() == 5);
  for (std::size_t e = 0; e < 5; ++e) CHECK(histories[0].epochs[e] == histories[1].epochs[e]);
  CHECK(histories[0].epochs[0].at("learning_rate") == Approx(1e-2));
  CHECK(histories[0].epochs[1].at("learning_rate") == Approx(1e-3));
  CHECK(rates[0] == rates[1]);
  CHECK(all_values(models[0]) == all_values(models[1]));
}

TEST_CASE("a callback on one process alone is agreed with the others, which have none", "[train][api][distributed]") {
  // Ring allreduce (2 ranks) and synchronous parameter servers (2 workers + 1 server): only worker 0 (rank
  // 1) has a callback; it stops after step 5, and the others, with no callback at all, stop with it.
  for (const bool servers : {false, true}) {
    INFO((servers ? "parameter servers" : "ring allreduce"));
    const int ranks = servers ? 3 : 2;
    comm::InProcessGroup group(ranks);
    std::vector<nn::Sequential> models;
    for (int r = 0; r < ranks; ++r) models.push_back(mlp(true));
    std::vector<train::History> histories(static_cast<std::size_t>(ranks));
    std::vector<std::string> errors(static_cast<std::size_t>(ranks));
    comm_test::run_ranks(ranks, [&](int rank) {
      std::shared_ptr<train::Strategy> strategy;
      if (servers) strategy = std::make_shared<train::ParameterServer>(group.transport(rank), 2);
      else strategy = std::make_shared<train::RingAllreduce>(group.transport(rank));
      Trainer trainer(models[static_cast<std::size_t>(rank)], adam(), strategy);
      auto options = quiet(10);
      if (rank == 1) {
        auto stopper = std::make_shared<train::LambdaCallback>();
        stopper->batch_end = [](std::int64_t step, const train::Logs&, train::TrainingControl& control) {
          if (step == 5) control.stop();
        };
        options.callbacks.push_back(stopper);
      }
      try {
        histories[static_cast<std::size_t>(rank)] = trainer.fit(three_classes(), options);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(rank)] = e.what();
      }
    });
    for (int r = 0; r < ranks; ++r) {
      INFO("rank " << r << ": " << errors[static_cast<std::size_t>(r)]);
      CHECK(errors[static_cast<std::size_t>(r)].empty());
      CHECK(histories[static_cast<std::size_t>(r)].epochs.size() == 1);
    }
    CHECK(all_values(models[0]) == all_values(models[1]));
  }
}

TEST_CASE("a rate a callback sets is seen by the callbacks after it in the same hook", "[train][api]") {
  nn::Sequential model = mlp(true);
  Trainer trainer(model, adam());
  auto options = quiet(2);
  auto cutter = std::make_shared<train::LambdaCallback>();
  cutter->epoch_end = [](std::int64_t, const train::Logs&, train::TrainingControl& control) {
    control.set_learning_rate(control.optimizer().learning_rate() / 4);
  };
  std::vector<double> seen;
  auto watcher = std::make_shared<train::LambdaCallback>();
  watcher->epoch_end = [&](std::int64_t, const train::Logs&, train::TrainingControl& control) {
    seen.push_back(control.optimizer().learning_rate());
  };
  options.callbacks = {cutter, watcher};
  trainer.fit(three_classes(), options);
  REQUIRE(seen.size() == 2);
  CHECK(seen[0] == Approx(1e-2 / 4));
  CHECK(seen[1] == Approx(1e-2 / 16));
  CHECK(trainer.optimizer().learning_rate() == Approx(1e-2 / 16));
}

TEST_CASE("EarlyStopping(restore_best_weights) runs on every replica or on none, and not over parameter servers",
          "[train][api][distributed]") {
  const auto run = [](bool on_chief, bool on_worker) {
    comm::InProcessGroup group(2, std::chrono::seconds(20), {"chief 0 (h:1)", "worker 0 (h:2)"});
    std::vector<nn::Sequential> models;
    for (int r = 0; r < 2; ++r) models.push_back(mlp(true));
    std::vector<std::string> errors(2);
    comm_test::run_ranks(2, [&](int rank) {
      Trainer trainer(models[static_cast<std::size_t>(rank)], adam(), std::make_shared<train::RingAllreduce>(group.transport(rank)));
      auto options = quiet(6, &three_classes());
      if (rank == 0 ? on_chief : on_worker)
        options.callbacks.push_back(std::make_shared<train::EarlyStopping>(train::EarlyStoppingOptions{
            .monitor = "learning_rate", .min_delta = 1.0, .patience = 2, .mode = train::Mode::Min, .restore_best_weights = true}));
      try {
        trainer.fit(three_classes(), options);
      } catch (const std::exception& e) {  // its own refusal, or the other's, which may come first
        errors[static_cast<std::size_t>(rank)] = e.what();
      }
    });
    CHECK(all_values(models[0]) == all_values(models[1]));
    return errors;
  };
  const auto alone = run(false, true);
  for (const auto& error : alone) {
    INFO(error);
    // Either process names both, the one without the callback and the one with it.
    CHECK_THAT(error, Catch::Contains("the processes that train differ in the callbacks that must run on every process: "
                                      "chief 0 runs none of them; worker 0 runs EarlyStopping(restore_best_weights)"));
  }
  {
    test_util::CapturedOutput log(STDERR_FILENO);
    for (const auto& error : run(true, true)) CHECK(error.empty());
    // The first epoch's rate is the best (nothing later improves on it by min_delta): its weights come back.
    CHECK_THAT(log.text(), Catch::Contains("restored the weights of epoch 1, the best learning_rate (0.01)"));
    CHECK_THAT(log.text(), Catch::Contains("learning_rate has not improved on 0.01 by more than 1 for 2 epoch(s)"));
  }

  comm::InProcessGroup group(3);
  std::vector<nn::Sequential> models;
  for (int r = 0; r < 3; ++r) models.push_back(mlp(true));
  std::vector<std::string> errors(3);
  comm_test::run_ranks(3, [&](int rank) {
    Trainer trainer(models[static_cast<std::size_t>(rank)], adam(), std::make_shared<train::ParameterServer>(group.transport(rank), 2));
    auto options = quiet(2);
    options.callbacks.push_back(std::make_shared<train::EarlyStopping>(train::EarlyStoppingOptions{.restore_best_weights = true}));
    try {
      trainer.fit(three_classes(), options);
    } catch (const std::exception& e) {
      errors[static_cast<std::size_t>(rank)] = e.what();
    }
  });
  CHECK(errors[0].find("cannot put back variables that parameter servers hold") != std::string::npos);
}

TEST_CASE("a rate changed behind the agreement's back is caught, not left to split the replicas", "[train][api][distributed]") {
  comm::InProcessGroup group(2);
  std::vector<nn::Sequential> models;
  for (int r = 0; r < 2; ++r) models.push_back(mlp(true));
  std::vector<std::string> errors(2);
  comm_test::run_ranks(2, [&](int rank) {
    Trainer trainer(models[static_cast<std::size_t>(rank)], adam(), std::make_shared<train::RingAllreduce>(group.transport(rank)));
    auto options = quiet(3);
    auto callback = std::make_shared<train::LambdaCallback>();
    if (rank == 0)
      callback->epoch_end = [](std::int64_t, const train::Logs&, train::TrainingControl& control) {
        control.optimizer().set_learning_rate(0.05);  // not control.set_learning_rate()
      };
    options.callbacks.push_back(callback);
    try {
      trainer.fit(three_classes(), options);
    } catch (const Error& e) {
      errors[static_cast<std::size_t>(rank)] = e.what();
    }
  });
  for (const auto& error : errors) CHECK_THAT(error, Catch::Contains("learning rates differ") && Catch::Contains("set_learning_rate"));
}

TEST_CASE("under parameter servers a worker's stop ends every process alike, a new rate reaches the servers", "[train][api][ps]") {
  comm::InProcessGroup group(3);
  std::vector<nn::Sequential> models;
  for (int r = 0; r < 3; ++r) models.push_back(mlp(true));
  const std::vector<float> initial = all_values(models[0]);
  std::vector<train::History> histories(3);
  auto strategies = std::vector<std::shared_ptr<train::ParameterServer>>{};
  for (int r = 0; r < 3; ++r) strategies.push_back(std::make_shared<train::ParameterServer>(group.transport(r), 2));
  comm_test::run_ranks(3, [&](int rank) {
    Trainer trainer(models[static_cast<std::size_t>(rank)], optim::SGD({.learning_rate = optim::constant(0.1)}),
                    strategies[static_cast<std::size_t>(rank)]);
    auto options = quiet(10, &three_classes());
    auto callback = std::make_shared<train::LambdaCallback>();
    if (rank == 1) {
      // Worker 1 alone: the rate all but vanishes from the start, and training stops after two epochs.
      callback->train_begin = [](train::TrainingControl& control) { control.set_learning_rate(1e-12); };
      callback->epoch_end = [](std::int64_t epoch, const train::Logs&, train::TrainingControl& control) {
        if (epoch == 1) control.stop();
      };
    }
    options.callbacks.push_back(callback);
    histories[static_cast<std::size_t>(rank)] = trainer.fit(three_classes(), options);
  });
  REQUIRE(histories[0].epochs.size() == 2);
  CHECK(histories[1].epochs == histories[0].epochs);
  CHECK(histories[2].epochs == histories[0].epochs);  // the server's History too
  const std::vector<float> trained = all_values(models[0]);
  REQUIRE(trained.size() == initial.size());
  float largest_change = 0;
  for (std::size_t i = 0; i < trained.size(); ++i) largest_change = std::max(largest_change, std::abs(trained[i] - initial[i]));
  CHECK(largest_change < 1e-6f);
}

TEST_CASE("EarlyStopping, ReduceLROnPlateau, ModelCheckpoint and CSVLogger", "[train][api]") {
  ScratchDirectory scratch("callbacks");
  nn::Sequential model = mlp(true);
  Trainer trainer(model, adam());
  auto options = quiet(12, &three_classes());
  // A monitor that cannot improve: stops after patience + 1 epochs, and the rate drops every 2 epochs.
  auto stopper = std::make_shared<train::EarlyStopping>(
      train::EarlyStoppingOptions{.monitor = "learning_rate", .min_delta = 1.0, .patience = 4, .mode = train::Mode::Min});
  auto plateau = std::make_shared<train::ReduceLROnPlateau>(
      train::ReduceLROnPlateauOptions{.monitor = "learning_rate", .factor = 0.5, .patience = 1, .mode = train::Mode::Min, .min_delta = 1.0});
  auto checkpoint = std::make_shared<train::ModelCheckpoint>(
      train::ModelCheckpointOptions{.path = scratch.path() / "w-{epoch:02d}-{val_loss:.3f}.weights", .keep_last = 2});
  options.callbacks = {stopper, plateau, checkpoint, std::make_shared<train::CSVLogger>(scratch.path() / "log.csv")};
  const auto history = trainer.fit(three_classes(), options);
  REQUIRE(history.epochs.size() == 5);
  CHECK(stopper->stopped_epoch() == 5);  // as the log says: "early stopping after epoch 5"
  CHECK(history.epochs[1].at("learning_rate") == Approx(1e-2));
  CHECK(history.epochs[2].at("learning_rate") == Approx(5e-3));
  CHECK(history.epochs[4].at("learning_rate") == Approx(1.25e-3));
  REQUIRE(checkpoint->kept().size() == 2);
  CHECK(checkpoint->kept()[1].filename().string().starts_with("w-05-"));
  CHECK(std::distance(std::filesystem::directory_iterator(scratch.path()), {}) == 3);
  std::ifstream csv(scratch.path() / "log.csv");
  std::string header, line;
  std::getline(csv, header);
  CHECK(header.starts_with("epoch,accuracy,data_seconds,learning_rate,loss"));
  int rows = 0;
  while (std::getline(csv, line)) ++rows;
  CHECK(rows == 5);

  nn::Sequential restored = mlp(true);
  nn::load_weights(restored, checkpoint->kept()[1]);
  CHECK(all_values(restored) == all_values(model));
  Trainer missing(model, adam());
  auto watching = quiet(1);
  watching.callbacks = {std::make_shared<train::EarlyStopping>()};
  CHECK_THROWS_WITH(missing.fit(three_classes(), watching), Catch::Contains("monitors 'val_loss'") &&
                                                                Catch::Contains("pass FitOptions::validation"));
}

TEST_CASE("weights files load into a model built alike, and refuse anything else", "[train][api][checkpoint]") {
  ScratchDirectory scratch("weights");
  nn::Sequential model = mlp(true);
  Trainer(model, adam()).fit(three_classes(), quiet(2));
  const auto path = scratch.path() / "model.weights";
  nn::save_weights(model, path);
  nn::Sequential fresh = mlp(true);
  nn::load_weights(fresh, path);
  const Tensor x = test_util::random_tensor({5, 4, 4, 1}, 3, 0.0f, 1.0f);
  CHECK(Trainer(fresh, adam()).predict(x).to_vector() == Trainer(model, adam()).predict(x).to_vector());

  nn::Sequential other = mlp(true, 4);
  const auto before = all_values(other);
  CHECK_THROWS_AS(nn::load_weights(other, path), DataError);
  CHECK(all_values(other) == before);
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  bytes[bytes.size() / 2] ^= 0x40;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  CHECK_THROWS_WITH(nn::load_weights(fresh, path), Catch::Contains("checksum"));

  // A checkpoint directory that cannot be made is an IoError naming it.
  std::ofstream(scratch.path() / "a-file") << "x";
  auto options = quiet(1);
  options.checkpoint_dir = scratch.path() / "a-file" / "run";
  CHECK_THROWS_AS(Trainer(model, adam()).fit(three_classes(), options), IoError);
}

TEST_CASE("a model file rebuilds the model, its weights and its input normalization without the model's code", "[train][api][checkpoint]") {
  ScratchDirectory scratch("model_file");
  // The flagship architecture (convolutions, batch normalization, pooling, dropout) trained briefly on
  // normalized data, then saved with that normalization.
  const auto set = data::make_synthetic({.samples = 64, .sample_shape = {32, 32, 3}, .classes = 10, .noise = 60});
  const auto stats = data::channel_statistics(set);
  nn::Sequential model = nn::cifar10_cnn({32, 32, 3}, 4);
  Trainer trainer(model, adam(1e-3));
  trainer.fit(set, {.max_steps = 2, .batch_size = 32, .transforms = {data::normalize(stats.mean, stats.stddev)},
                    .verbosity = train::Verbosity::Silent});
  const auto path = scratch.path() / "flagship.model";
  nn::save_model(model, path, {.input_mean = stats.mean, .input_stddev = stats.stddev});

  nn::Sequential loaded = nn::load_model(path);
  CHECK(loaded.size() == model.size() + 1);
  CHECK(loaded.layer(0).type_name() == "Normalization");
  CHECK(loaded.summary().find("Total params") != std::string::npos);
  // Raw images into the loaded model give what normalized images give the trained one.
  const Tensor raw = test_util::random_tensor({6, 32, 32, 3}, 9, 0.0f, 1.0f);
  Tensor normalized = raw.clone();
  const auto normalize = data::normalize(stats.mean, stats.stddev);
  std::mt19937_64 unused;
  for (std::int64_t i = 0; i < 6; ++i)
    normalize({normalized.data() + i * 32 * 32 * 3, 32 * 32 * 3}, Shape{32, 32, 3}, unused);
  const auto expected = Trainer(model, adam()).predict(normalized).to_vector();
  const auto got = Trainer(loaded, adam()).predict(raw).to_vector();
  REQUIRE(got.size() == expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(expected[i]).margin(1e-5));

  // A loaded model saves again as it is (its normalization included), and loads the same.
  nn::save_model(loaded, scratch.path() / "again.model");
  nn::Sequential again = nn::load_model(scratch.path() / "again.model");
  CHECK(Trainer(again, adam()).predict(raw).to_vector() == got);
  CHECK_THROWS_WITH(nn::save_model(loaded, scratch.path() / "twice.model", {.input_mean = stats.mean, .input_stddev = stats.stddev}),
                    Catch::Contains("already has its input normalization"));
  CHECK_THROWS_AS(nn::load_model(scratch.path() / "missing.model"), IoError);
  CHECK_THROWS_WITH(nn::load_model(scratch.path()), Catch::Contains("is a directory"));

  // A user-defined layer cannot be saved as a model; a damaged file is a DataError.
  struct Square : nn::ActivationLayer {
    Square() : nn::ActivationLayer(Activation::Tanh, "Square", "square") {}
    std::optional<nn::LayerConfig> config() const override { return std::nullopt; }
  };
  nn::Sequential custom({2});
  custom.add(Square());
  CHECK_THROWS_WITH(nn::save_model(custom, scratch.path() / "custom.model"), Catch::Contains("'square' (Square) has no config"));
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() - 10);
  CHECK_THROWS_AS(nn::load_model(path), DataError);
}

TEST_CASE("in-memory float targets train alike on one process and on two ranks of the ring", "[train][api][distributed]") {
  const auto plane = line_set();
  const auto model_for = [] {
    nn::Sequential model({2}, 1);
    model.add(nn::Dense(1));
    return model;
  };
  const train::TrainerOptions mse{.loss = nn::MeanSquaredError{}, .metrics = {"mae"}};
  nn::Sequential single = model_for();
  Trainer(single, optim::SGD({.learning_rate = optim::constant(0.1)}), std::make_shared<train::Local>(), mse)
      .fit(plane, {.epochs = 3, .batch_size = 20, .shuffle = false, .verbosity = train::Verbosity::Silent});
  comm::InProcessGroup group(2);
  std::vector<nn::Sequential> replicas;
  for (int r = 0; r < 2; ++r) replicas.push_back(model_for());
  comm_test::run_ranks(2, [&](int rank) {
    Trainer(replicas[static_cast<std::size_t>(rank)], optim::SGD({.learning_rate = optim::constant(0.1)}),
            std::make_shared<train::RingAllreduce>(group.transport(rank)), mse)
        .fit(plane, {.epochs = 3, .batch_size = 10, .shuffle = false, .verbosity = train::Verbosity::Silent});
  });
  const auto expected = all_values(single), got = all_values(replicas[0]);
  REQUIRE(got.size() == expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(expected[i]).epsilon(1e-5));
  CHECK(all_values(replicas[1]) == got);
}
