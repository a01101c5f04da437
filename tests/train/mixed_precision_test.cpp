// Precision policies: a mixed model keeps float32 variables, computes in its 16-bit type, answers in float32,
// trains as a float32 one does, resumes exactly from its checkpoints and saves a float32 model file.
#include <catch2/catch.hpp>

#include <cmath>
#include <latch>
#include <limits>

#include "cohort/comm/inproc.hpp"
#include "cohort/data/synthetic.hpp"
#include "cohort/nn/activation_layer.hpp"
#include "cohort/nn/batch_normalization.hpp"
#include "cohort/nn/conv2d.hpp"
#include "cohort/nn/dense.hpp"
#include "cohort/nn/dropout.hpp"
#include "cohort/nn/flatten.hpp"
#include "cohort/nn/model_file.hpp"
#include "cohort/nn/pooling2d.hpp"
#include "cohort/optim/adam.hpp"
#include "cohort/optim/sgd.hpp"
#include "cohort/train/parameter_server.hpp"
#include "cohort/train/ring_allreduce.hpp"
#include "cohort/train/trainer.hpp"
#include "cohort/train/update.hpp"
#include "comm/comm_test_util.hpp"
#include "ps/ps_test_util.hpp"
#include "test_util.hpp"
#include "train/tiny_cnn.hpp"

using namespace cohort;
using test_util::ScratchDirectory;
using train_test::snapshot;
using train_test::synthetic_set;
using train_test::tiny_cnn;

namespace {

// The largest |a - b| over the largest |b|.
double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double difference = 0, magnitude = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    difference = std::max(difference, std::abs(static_cast<double>(a[i]) - b[i]));
    magnitude = std::max(magnitude, std::abs(static_cast<double>(b[i])));
  }
  return difference / magnitude;
}

const train::FitOptions kSilent{.epochs = 4, .batch_size = 32, .verbosity = train::Verbosity::Silent};

}  // namespace

TEST_CASE("a mixed-precision model keeps float32 variables, computes in its 16-bit type and answers in float32",
          "[train][dtype]") {
  const Tensor batch = test_util::random_tensor({16, 8, 8, 2}, 3);
  const Tensor labels = Tensor::from_values({16}, std::vector<std::int32_t>{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3});
  nn::Sequential reference = tiny_cnn(nn::Precision::Float32);
  reference.train();
  const Tensor expected = reference.forward_logits(batch).clone();
  const Tensor dexpected(expected.shape());
  ops::softmax_cross_entropy(expected, labels, dexpected);
  reference.backward(dexpected);
  for (nn::Precision precision : {nn::Precision::MixedBFloat16, nn::Precision::MixedFloat16}) {
    const DType low = nn::compute_dtype(precision);
    INFO(nn::precision_name(precision));
    nn::Sequential model = tiny_cnn(precision);
    model.train();
    const Tensor logits = model.forward_logits(batch);
    CHECK(logits.dtype() == DType::Float32);
    // The 16-bit type's rounding shows, within a few of its units.
    const double logits_error = relative_difference(logits.to_vector(), expected.to_vector());
    CHECK(logits_error > 0);
    CHECK(logits_error < 64 * unit_roundoff(low));
    const Tensor dlogits(logits.shape());
    ops::softmax_cross_entropy(logits, labels, dlogits);
    model.backward(dlogits);
    const auto variables = model.variables(), reference_variables = reference.variables();
    for (std::size_t i = 0; i < variables.size(); ++i) {
      const auto& v = variables[i];
      INFO(v->name);
      CHECK(v->value.dtype() == DType::Float32);
      if (!v->trainable) continue;
      REQUIRE(v->gradient.dtype() == DType::Float32);
      // The batch normalization after the convolution cancels its bias: that gradient is rounding alone.
      if (v->name == "conv2d/bias") continue;
      CHECK(relative_difference(v->gradient.to_vector(), reference_variables[i]->gradient.to_vector()) < 256 * unit_roundoff(low));
    }
    // A final softmax runs in float32: the probabilities sum to 1 to float32's precision, not the 16-bit type's.
    model.eval();
    const std::vector<float> probabilities = model.forward(batch).to_vector();
    for (std::size_t row = 0; row < 16; ++row) {
      double sum = 0;
      for (std::size_t c = 0; c < 4; ++c) sum += probabilities[row * 4 + c];
      CHECK(std::abs(sum - 1.0) < 1e-6);
    }
  }
}

TEST_CASE("mixed-precision models learn the synthetic task as a float32 one does", "[train][dtype]") {
  for (nn::Precision precision : {nn::Precision::MixedBFloat16, nn::Precision::MixedFloat16}) {
    INFO(nn::precision_name(precision));
    nn::Sequential model = tiny_cnn(precision);
    Trainer trainer(model, optim::Adam({.learning_rate = optim::constant(3e-3)}));
    auto options = kSilent;
    options.epochs = 8;
    options.validation = &synthetic_set();
    const auto history = trainer.fit(synthetic_set(), options);
    CHECK(history.epochs.back().at("val_accuracy") >= 0.95);
    CHECK(history.epochs.back().at("loss") < history.epochs.front().at("loss"));
  }
}

TEST_CASE("mixed-precision runs resume from their checkpoints exactly, loss scale included", "[train][dtype][checkpoint]") {
  for (nn::Precision precision : {nn::Precision::MixedBFloat16, nn::Precision::MixedFloat16}) {
    INFO(nn::precision_name(precision));
    ScratchDirectory dir("mixed-resume");
    nn::Sequential straight = tiny_cnn(precision);
    Trainer straight_trainer(straight, optim::Adam());
    straight_trainer.fit(synthetic_set(), kSilent);

    nn::Sequential first = tiny_cnn(precision);
    Trainer first_trainer(first, optim::Adam());
    auto interrupted = kSilent;
    interrupted.checkpoint_dir = dir.path();
    interrupted.checkpoint_every_steps = 1;
    interrupted.max_steps = 30;
    first_trainer.fit(synthetic_set(), interrupted);

    nn::Sequential resumed = tiny_cnn(precision);
    Trainer resumed_trainer(resumed, optim::Adam());
    auto resume = kSilent;
    resume.checkpoint_dir = dir.path();
    resume.resume = true;
    resumed_trainer.fit(synthetic_set(), resume);
    CHECK(resumed_trainer.optimizer().iterations() == straight_trainer.optimizer().iterations());
    CHECK(snapshot(resumed) == snapshot(straight));
  }
}

TEST_CASE("the loss scale halves on a skipped step, doubles after 2000 finite ones, and gives up by name", "[train][dtype]") {
  train::LossScale scale;
  CHECK(scale.value() == 32768.0f);
  scale.record(false, "dense/kernel");
  CHECK(scale.value() == 16384.0f);
  for (int i = 0; i < 1999; ++i) scale.record(true, "");
  CHECK(scale.value() == 16384.0f);
  CHECK(scale.finite_steps() == 1999);
  scale.record(true, "");
  CHECK(scale.value() == 32768.0f);
  CHECK(scale.finite_steps() == 0);
  for (int i = 1; i < train::LossScale::kMaxSkipsInARow; ++i) scale.record(false, "conv2d_1/kernel");
  CHECK(scale.skips_in_a_row() == train::LossScale::kMaxSkipsInARow - 1);
  CHECK_THROWS_WITH(scale.record(false, "conv2d_1/kernel"),
                    Catch::Contains("the gradient of conv2d_1/kernel was not finite in 32 steps in a row"));
}

TEST_CASE("a loss-scaled update divides the scale out, and a non-finite step changes nothing but the scale", "[train][dtype]") {
  const auto variables_with = [](float gradient_value) {
    auto v = std::make_shared<nn::Variable>();
    v->name = "dense/kernel";
    v->value = Tensor::full({3}, 1.0f);
    v->gradient = Tensor::full({3}, gradient_value);
    return std::vector<nn::VariablePtr>{v};
  };
  // With a power-of-two scale the unscaled update is the plain one, bit for bit.
  optim::Adam plain_adam, scaled_adam;
  const auto plain = variables_with(0.25f), scaled = variables_with(0.25f * 1024);
  train::LossScale scale(1024, 0);
  CHECK(train::update_variables(plain_adam, plain));
  CHECK(train::update_variables(scaled_adam, scaled, &scale));
  CHECK(scaled[0]->value.to_vector() == plain[0]->value.to_vector());
  CHECK(scale.finite_steps() == 1);
  const auto overflowed = variables_with(0.25f);
  overflowed[0]->gradient.data()[1] = std::numeric_limits<float>::infinity();
  const std::vector<float> before = overflowed[0]->value.to_vector();
  CHECK_FALSE(train::update_variables(scaled_adam, overflowed, &scale));
  CHECK(overflowed[0]->value.to_vector() == before);
  CHECK(scaled_adam.iterations() == 1);
  CHECK(scale.value() == 512.0f);
}

TEST_CASE("an overflow on one replica skips the same step on every replica", "[train][dtype][distributed]") {
  // Also sharded: under zero2 the overflowed bias is in rank 0's piece only, and rank 1 must skip as well.
  for (int stage : {0, 1, 2}) {
    INFO("zero stage " << stage);
    comm::InProcessGroup group(2);
    std::vector<float> scales(2);
    std::vector<int> kernels_changed(2);
    std::vector<std::int64_t> iterations(2);
    comm_test::run_ranks(2, [&](int r) {
      nn::Sequential model({4}, 3);
      model.add(nn::Dense(2));
      train::RingAllreduce ring(group.transport(r), {.zero_stage = stage});
      train::LossScale scale;
      comm_test::expect(ring.set_loss_scale(&scale), "the ring takes a loss scale");
      optim::SGD sgd;
      ring.initialize(model, sgd);
      const std::vector<float> before = model.variable("dense/kernel")->value.to_vector();
      for (const auto& v : model.trainable_variables()) ops::fill(v->gradient, 1.0f);
      if (r == 1) model.variable("dense/bias")->gradient.data()[0] = std::numeric_limits<float>::quiet_NaN();
      ring.apply_gradients(model, sgd, 8);
      scales[static_cast<std::size_t>(r)] = scale.value();
      kernels_changed[static_cast<std::size_t>(r)] = model.variable("dense/kernel")->value.to_vector() != before;
      iterations[static_cast<std::size_t>(r)] = sgd.iterations();
    });
    CHECK(scales == std::vector<float>{16384.0f, 16384.0f});
    CHECK(kernels_changed == std::vector<int>{0, 0});
    CHECK(iterations == std::vector<std::int64_t>{0, 0});
  }
}

TEST_CASE("bfloat16 gradients on the ring update as float32 ones do, within bfloat16's rounding", "[train][dtype][distributed]") {
  // Uneven shares (33 and 300 samples: 333 has no bfloat16), so the weighting by sample counts is exercised.
  const auto update_with = [](DType wire) {
    comm::InProcessGroup group(2);
    std::vector<std::vector<float>> kernels(2);
    comm_test::run_ranks(2, [&](int r) {
      nn::Sequential model({40}, 3);
      model.add(nn::Dense(30));
      train::RingAllreduce ring(group.transport(r), {.gradient_dtype = wire});
      optim::SGD sgd({.learning_rate = optim::constant(1.0)});
      ring.initialize(model, sgd);
      for (const auto& v : model.trainable_variables()) {
        std::vector<float> values(static_cast<std::size_t>(v->gradient.numel()));
        for (std::size_t i = 0; i < values.size(); ++i) values[i] = std::cos(static_cast<float>(i) * 0.1f + static_cast<float>(r));
        v->gradient = Tensor::from_values(v->gradient.shape(), values);
      }
      ring.apply_gradients(model, sgd, r == 0 ? 33 : 300);
      kernels[static_cast<std::size_t>(r)] = model.variable("dense/kernel")->value.to_vector();
    });
    CHECK(kernels[0] == kernels[1]);
    return kernels[0];
  };
  nn::Sequential initial({40}, 3);
  initial.add(nn::Dense(30));
  const std::vector<float> start = initial.variable("dense/kernel")->value.to_vector();
  const std::vector<float> float32 = update_with(DType::Float32), bfloat16 = update_with(DType::BFloat16);
  std::vector<float> float32_step(start.size()), bfloat16_step(start.size());
  for (std::size_t i = 0; i < start.size(); ++i) {
    float32_step[i] = float32[i] - start[i];
    bfloat16_step[i] = bfloat16[i] - start[i];
  }
  const double difference = relative_difference(bfloat16_step, float32_step);
  CHECK(difference > 0);
  CHECK(difference < 4 * unit_roundoff(DType::BFloat16));
}

TEST_CASE("under parameter servers an overflow on one worker skips that step on every server and every worker",
          "[train][dtype][ps]") {
  // Three steps of SGD at rate 0.5 on unscaled gradients of 1 (exact in float); worker 1 overflows at the second.
  for (const ps::Consistency consistency : {ps::Consistency{ps::Sync{}}, ps::Consistency{ps::Async{}}}) {
    const bool sync = std::holds_alternative<ps::Sync>(consistency);
    INFO(ps::describe(consistency));
    comm::InProcessGroup group(4, std::chrono::seconds(20), ps_test::process_names(2, 2));
    std::vector<float> scales(2);
    std::vector<std::string> skipped(2);
    std::vector<std::vector<float>> kernels(2);
    std::vector<std::int64_t> iterations(2);
    std::vector<int> scaled(4);  // set_loss_scale() took the scale
    std::vector<float> start;
    std::vector<ps::ServerStats> server_stats;
    std::latch pushed(2);  // both workers' pushes are in before the chief reads the servers' counters
    ps_test::run_cluster(group, 2, 2, {.consistency = consistency}, [&](int r, auto strategy) {
      nn::Sequential model({4}, 3);
      model.add(nn::Dense(2));
      optim::SGD sgd({.learning_rate = optim::constant(0.5)});
      train::LossScale scale;
      scaled[static_cast<std::size_t>(r)] = strategy->set_loss_scale(&scale);
      if (strategy->serves()) {
        strategy->serve(model, sgd, {});
        return;
      }
      strategy->initialize(model, sgd);
      if (r == 0) start = model.variable("dense/kernel")->value.to_vector();
      for (int step = 0; step < 3; ++step) {
        strategy->begin_gradients(model, 8);
        for (const auto& v : model.trainable_variables()) ops::fill(v->gradient, scale.value());
        if (r == 1 && step == 1) model.variable("dense/bias")->gradient.data()[1] = std::numeric_limits<float>::infinity();
        strategy->apply_gradients(model, sgd, 8);
        if (!strategy->store().skipped_because()) continue;
        skipped[static_cast<std::size_t>(r)] += fmt::format("{}: {};", step, *strategy->store().skipped_because());
      }
      scales[static_cast<std::size_t>(r)] = scale.value();
      kernels[static_cast<std::size_t>(r)] = model.variable("dense/kernel")->value.to_vector();
      iterations[static_cast<std::size_t>(r)] = sgd.iterations();  // the servers' updates, skips not counted
      pushed.arrive_and_wait();
      strategy->finish({}, sgd);
      if (r == 0) server_stats = strategy->final_server_stats();
    });
    CHECK(scaled == std::vector<int>{1, 1, 1, 1});
    REQUIRE(server_stats.size() == 2);
    if (sync) {
      // One step skipped by both servers and both workers: two updates of 0.5 each.
      CHECK(scales == std::vector<float>{16384.0f, 16384.0f});
      CHECK(skipped == std::vector<std::string>{"1: dense/bias of worker 1;", "1: dense/bias of worker 1;"});
      for (const auto& stats : server_stats) CHECK(stats.updates == 2);
      CHECK(iterations == std::vector<std::int64_t>{2, 2});
      CHECK(kernels[0] == kernels[1]);
      for (std::size_t i = 0; i < start.size(); ++i) CHECK(kernels[0][i] == start[i] - 1.0f);
    } else {
      // Only worker 1's overflowed push is dropped, by both servers; worker 0's scale never halves.
      CHECK(scales == std::vector<float>{32768.0f, 16384.0f});
      CHECK(skipped == std::vector<std::string>{"", "1: dense/bias of worker 1;"});
      for (const auto& stats : server_stats) CHECK(stats.updates == 5);
    }
  }
}

TEST_CASE("mixed_float16 trains under parameter servers, and is refused by name with backup workers", "[train][dtype][ps]") {
  comm::InProcessGroup group(4);
  std::vector<nn::Sequential> models;
  for (int r = 0; r < 4; ++r) models.push_back(tiny_cnn(nn::Precision::MixedFloat16));
  std::vector<train::History> histories(2);
  ps_test::run_cluster(group, 2, 2, {}, [&](int r, auto strategy) {
    Trainer trainer(models[static_cast<std::size_t>(r)], optim::Adam({.learning_rate = optim::constant(3e-3)}), strategy);
    const train::History history = trainer.fit(synthetic_set(), kSilent);
    if (r < 2) histories[static_cast<std::size_t>(r)] = history;
  });
  CHECK(histories[0].epochs.back().at("loss") < 0.5 * histories[0].epochs.front().at("loss"));
  CHECK(snapshot(models[0]) == snapshot(models[1]));

  comm::InProcessGroup backup_group(3);
  nn::Sequential model = tiny_cnn(nn::Precision::MixedFloat16);
  Trainer trainer(model, optim::Adam(),
                  std::make_shared<train::ParameterServer>(backup_group.transport(0), 2,
                                                           train::ParameterServerOptions{.consistency = ps::Sync{.backup_workers = 1}}));
  CHECK_THROWS_WITH(trainer.fit(synthetic_set(), kSilent),
                    Catch::Contains("mixed_float16 needs dynamic loss scaling") && Catch::Contains("without backup workers"));
}

TEST_CASE("a mixed_float16 parameter-server run resumes from its checkpoint exactly", "[train][dtype][ps][checkpoint]") {
  const auto run = [](int steps, const std::filesystem::path& dir) {
    comm::InProcessGroup group(4);
    std::vector<nn::Sequential> models;
    for (int r = 0; r < 4; ++r) models.push_back(tiny_cnn(nn::Precision::MixedFloat16));
    auto options = kSilent;
    options.epochs = 1000;
    options.max_steps = steps;
    options.checkpoint_dir = dir;
    options.checkpoint_every_steps = 3;
    options.resume = true;
    ps_test::run_cluster(group, 2, 2, {}, [&](int r, auto strategy) {
      Trainer(models[static_cast<std::size_t>(r)], optim::Adam(), strategy).fit(synthetic_set(), options);
    });
    return std::pair(snapshot(models[0]), snapshot(models[1]));
  };
  ScratchDirectory straight_dir("mixed-ps-straight"), dir("mixed-ps-resumed");
  const auto straight = run(8, straight_dir.path());
  run(3, dir.path());
  const auto resumed = run(8, dir.path());
  CHECK(resumed.first == straight.first);
  CHECK(resumed.second == straight.first);
}

TEST_CASE("a model trained in mixed precision saves a model file that predicts in float32", "[train][dtype]") {
  ScratchDirectory dir("mixed-model");
  nn::Sequential model = tiny_cnn(nn::Precision::MixedBFloat16);
  Trainer trainer(model, optim::Adam({.learning_rate = optim::constant(3e-3)}));
  trainer.fit(synthetic_set(), kSilent);
  nn::save_model(model, dir.path() / "mixed.model");
  nn::Sequential served = nn::load_model(dir.path() / "mixed.model");
  CHECK(served.precision() == nn::Precision::Float32);
  const Tensor batch = test_util::random_tensor({8, 8, 8, 2}, 9);
  const std::vector<float> float32_answer = served.infer(batch).to_vector();
  const std::vector<float> mixed_answer = model.infer(batch).to_vector();
  CHECK(relative_difference(mixed_answer, float32_answer) < 64 * unit_roundoff(DType::BFloat16));
  model.set_precision(nn::Precision::Float32);
  CHECK(model.infer(batch).to_vector() == float32_answer);
}

TEST_CASE("a mixed-precision model computes on the emulated device what it computes on the CPU", "[train][dtype][device]") {
  const Tensor batch = test_util::random_tensor({6, 8, 8, 2}, 4);
  nn::Sequential on_cpu = tiny_cnn(nn::Precision::MixedBFloat16);
  nn::Sequential emulated = tiny_cnn(nn::Precision::MixedBFloat16, Device::Emulated);
  on_cpu.train();
  emulated.train();
  CHECK(emulated.forward(batch.to(Device::Emulated)).to_vector() == on_cpu.forward(batch).to_vector());
}
