#include <catch2/catch.hpp>
#include <fstream>

#include "cohort/core/error.hpp"
#include "cohort/core/settings.hpp"
#include "cohort/data/synthetic.hpp"
#include "cohort/nn/activation_layer.hpp"
#include "cohort/nn/batch_normalization.hpp"
#include "cohort/nn/conv2d.hpp"
#include "cohort/nn/dense.hpp"
#include "cohort/nn/dropout.hpp"
#include "cohort/nn/flatten.hpp"
#include "cohort/nn/pooling2d.hpp"
#include "cohort/optim/adam.hpp"
#include "cohort/optim/sgd.hpp"
#include "cohort/tensor/gemm_path.hpp"
#include "cohort/train/trainer.hpp"
#include "test_util.hpp"
#include "train/tiny_cnn.hpp"

using namespace cohort;
using test_util::ScratchDirectory;
using train_test::snapshot;
using train_test::synthetic_set;
using train_test::tiny_cnn;

TEST_CASE("fit learns a synthetic task and reports per-epoch history", "[train]") {
  nn::Sequential model = tiny_cnn();
  Trainer trainer(model, optim::Adam({.learning_rate = optim::constant(3e-3)}));
  const auto history = trainer.fit(synthetic_set(), {.epochs = 4, .batch_size = 32, .validation = &synthetic_set(),
                                                     .verbosity = train::Verbosity::Silent});
  REQUIRE(history.epochs.size() == 4);
  CHECK(history.epochs.back().at("val_accuracy") > 0.95);
  CHECK(history.epochs.back().at("loss") < history.epochs.front().at("loss"));
  CHECK(trainer.optimizer().iterations() == 4 * 19);
  const std::string csv = history.to_csv();
  CHECK(csv.rfind("epoch,accuracy,data_seconds,learning_rate,loss,samples_per_second,seconds,val_accuracy,val_loss,validation_seconds\n1,", 0) == 0);
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 5);
  const auto logs = trainer.evaluate(synthetic_set());
  CHECK(logs.at("accuracy") == Approx(history.epochs.back().at("val_accuracy")));
  Tensor batch({3, 8, 8, 2});
  const Tensor probabilities = trainer.predict(batch);
  CHECK(probabilities.shape() == Shape({3, 4}));
  CHECK(probabilities.data()[0] + probabilities.data()[1] + probabilities.data()[2] + probabilities.data()[3] == Approx(1.0));
}

TEST_CASE("max_steps, callbacks and early stop", "[train]") {
  nn::Sequential model = tiny_cnn();
  Trainer trainer(model, optim::SGD({.learning_rate = optim::constant(0.05), .momentum = 0.9}));
  std::int64_t batches = 0, epochs_ended = 0;
  auto callback = std::make_shared<train::LambdaCallback>();
  callback->batch_end = [&](std::int64_t, const train::Logs& logs, train::TrainingControl&) {
    ++batches;
    CHECK(logs.count("loss") == 1);
  };
  callback->epoch_end = [&](std::int64_t, const train::Logs&, train::TrainingControl& control) {
    if (++epochs_ended == 2) control.stop();
  };
  trainer.fit(synthetic_set(), {.epochs = 10, .batch_size = 50, .callbacks = {callback}, .verbosity = train::Verbosity::Silent});
  CHECK(epochs_ended == 2);
  CHECK(batches == 24);

  nn::Sequential limited = tiny_cnn();
  Trainer limited_trainer(limited, optim::SGD());
  const auto history = limited_trainer.fit(synthetic_set(), {.max_steps = 7, .batch_size = 50, .verbosity = train::Verbosity::Silent});
  CHECK(limited_trainer.optimizer().iterations() == 7);
  CHECK(history.epochs.size() == 1);
}

TEST_CASE("resuming from a checkpoint reproduces an uninterrupted run exactly", "[train][checkpoint]") {
  ScratchDirectory dir("resume");
  const train::FitOptions base{.epochs = 3, .batch_size = 40, .seed = 5, .transforms = {data::random_flip_horizontal()},
                               .verbosity = train::Verbosity::Silent};

  nn::Sequential straight = tiny_cnn();
  Trainer straight_trainer(straight, optim::Adam());
  straight_trainer.fit(synthetic_set(), base);

  // Interrupted mid-epoch 2 by a step limit, then resumed by a fresh process-like setup.
  nn::Sequential first = tiny_cnn();
  Trainer first_trainer(first, optim::Adam());
  auto interrupted = base;
  interrupted.checkpoint_dir = dir.path();
  interrupted.checkpoint_every_steps = 1;
  interrupted.max_steps = 22;
  first_trainer.fit(synthetic_set(), interrupted);

  nn::Sequential resumed = tiny_cnn();
  Trainer resumed_trainer(resumed, optim::Adam());
  auto resume = base;
  resume.checkpoint_dir = dir.path();
  resume.resume = true;
  const auto history = resumed_trainer.fit(synthetic_set(), resume);
  CHECK(resumed_trainer.optimizer().iterations() == straight_trainer.optimizer().iterations());
  CHECK(snapshot(resumed) == snapshot(straight));
  CHECK(history.epochs.size() == 3);
}

TEST_CASE("fit refuses data that does not fit the model, naming both", "[train]") {
  nn::Sequential model = tiny_cnn();
  Trainer trainer(model, optim::SGD());
  const auto wrong_shape = data::make_synthetic({.samples = 10, .sample_shape = {8, 8, 3}, .classes = 4});
  CHECK_THROWS_WITH(trainer.fit(wrong_shape, {.verbosity = train::Verbosity::Silent}), Catch::Contains("(8, 8, 3)"));
  const auto wrong_classes = data::make_synthetic({.samples = 10, .sample_shape = {8, 8, 2}, .classes = 5});
  CHECK_THROWS_WITH(trainer.fit(wrong_classes, {.verbosity = train::Verbosity::Silent}), Catch::Contains("5 classes"));
  const auto empty = data::make_synthetic({.samples = 0, .sample_shape = {8, 8, 2}, .classes = 4});
  CHECK_THROWS_AS(trainer.fit(empty, {.verbosity = train::Verbosity::Silent}), InvalidArgument);
}

TEST_CASE("a diverging run stops with an error that names the step", "[train]") {
  nn::Sequential model({8, 8, 2}, 1);
  model.add(nn::Flatten()).add(nn::Dense(4)).add(nn::Softmax());
  Trainer trainer(model, optim::SGD({.learning_rate = optim::constant(1e38)}));
  CHECK_THROWS_WITH(trainer.fit(synthetic_set(), {.epochs = 3, .verbosity = train::Verbosity::Silent}),
                    Catch::Contains("training loss became") && Catch::Contains("at step 1 ") &&
                        Catch::Contains("; lower the learning rate"));
  // On the CPU the loss is read before the backward pass: the bad step made no update.
  for (const auto& variable : model.variables())
    for (float v : variable->value.values()) REQUIRE(std::isfinite(v));
  // Under mixed_float16 the message says what overflowed.
  nn::Sequential mixed({8, 8, 2}, 1);
  mixed.add(nn::Flatten()).add(nn::Dense(4)).add(nn::Softmax());
  mixed.set_precision(nn::Precision::MixedFloat16);
  Trainer mixed_trainer(mixed, optim::SGD({.learning_rate = optim::constant(1e38)}));
  CHECK_THROWS_WITH(mixed_trainer.fit(synthetic_set(), {.epochs = 3, .verbosity = train::Verbosity::Silent}),
                    Catch::Contains("training loss became") && Catch::Contains("activations overflow float16"));
}

TEST_CASE("fit shows the rate in images for image inputs and in samples for others", "[train]") {
  // What fit() prints on stdout, which the test takes over for the run.
  const auto printed = [](nn::Sequential& model, const data::Dataset& set) {
    test_util::CapturedOutput out(STDOUT_FILENO);
    Trainer(model, optim::SGD()).fit(set, {.epochs = 1, .batch_size = 16, .verbosity = train::Verbosity::Lines});
    return out.text();
  };
  nn::Sequential images = tiny_cnn();
  const std::string image_run = printed(images, synthetic_set());
  CHECK(image_run.find(" img/s") != std::string::npos);
  nn::Sequential rows({6}, 1);
  rows.add(nn::Dense(4)).add(nn::Softmax());
  const std::string row_run = printed(rows, data::make_synthetic({.samples = 64, .sample_shape = {6}, .classes = 4}));
  CHECK(row_run.find(" samples/s") != std::string::npos);
  CHECK(row_run.find("img/s") == std::string::npos);
}

TEST_CASE("the progress bar: loss first, metrics in the order given, time per step, cut to the width", "[train]") {
  ScratchDirectory scratch("progress");
  const auto path = scratch.path() / "progress.txt";
  std::FILE* out = std::fopen(path.c_str(), "w+");
  REQUIRE(out != nullptr);
  const train::OrderedLogs logs{{"loss", 0.5}, {"top_3_accuracy", 0.9}, {"accuracy", 0.75}};
  {
    train::ProgressBar lines(20, out, train::ProgressBar::Style::Lines);
    for (int step = 1; step <= 20; ++step) lines.update(step, logs, 100);
    lines.finish(logs, 2.0, 2.0, 100);
  }
  {
    train::ProgressBar rows(20, out, train::ProgressBar::Style::Lines, "samples/s");  // not images
    rows.finish(logs, 2.0, 2.0, 100);
  }
  {
    train::ProgressBar stopped(20, out, train::ProgressBar::Style::Lines);  // a stop after step 5
    for (int step = 1; step <= 5; ++step) stopped.update(step, logs, 100);
    stopped.finish(logs, 1.0, 1.0, 100);
  }
  {
    train::ProgressBar validated(20, out, train::ProgressBar::Style::Lines);  // 1 s of validation after 2 s of steps
    validated.finish(logs, 3.0, 2.0, 100);
  }
  {
    ::setenv("COLUMNS", "60", 1);
    train::ProgressBar bar(20, out, train::ProgressBar::Style::Bar);
    bar.update(20, logs, 100);
    ::unsetenv("COLUMNS");
  }
  std::fclose(out);
  {
    // advance() says when a draw is due, so that the values are read only then.
    std::FILE* null = std::fopen("/dev/null", "w");
    REQUIRE(null != nullptr);
    train::ProgressBar lines(20, null, train::ProgressBar::Style::Lines), bar(20, null, train::ProgressBar::Style::Bar),
        quiet(20, null, train::ProgressBar::Style::EpochOnly);
    std::vector<int> due;
    for (int step = 1; step <= 20; ++step) {
      if (lines.advance(step)) {
        due.push_back(step);
        lines.draw(logs, 100);
      }
      CHECK(!quiet.advance(step));
    }
    CHECK(due == std::vector<int>{1, 3, 5, 7, 9, 11, 13, 15, 17, 19});
    CHECK(bar.advance(20));  // the last step always, however soon
    std::fclose(null);
  }
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  const auto first_line = text.substr(0, text.find('\n'));
  CHECK(first_line.find("/step - loss: 0.5000 - top_3_accuracy: 0.9000 - accuracy: 0.7500") != std::string::npos);
  CHECK(text.find("20/20 [==============================] - 2s 100ms/step - loss: 0.5000") != std::string::npos);
  CHECK(text.find(" 5/20 [=======.......................] - 1s 200ms/step - loss: 0.5000") != std::string::npos);
  CHECK(text.find("20/20 [==============================] - 3s 100ms/step - loss: 0.5000") != std::string::npos);
  CHECK(text.find("100 img/s") != std::string::npos);
  CHECK(text.find("100 samples/s") != std::string::npos);
  const auto redraw = text.substr(text.rfind('\r') + 1);
  CHECK(redraw.size() <= 59 + 3);  // the line, then the erase-to-end sequence
  CHECK(redraw.find("loss: 0.5000 - top_3_accuracy: 0.9000") != std::string::npos);  // the bar went, not the numbers
  // Messages of checks name the cause without a source location.
  try {
    nn::Sequential model({2});
    model.add(nn::Dense(0));
    FAIL("a Dense of 0 units was accepted");
  } catch (const InvalidArgument& e) {
    CHECK(std::string(e.what()).find(".cpp") == std::string::npos);
    CHECK(std::string(e.what()).find(".hpp") == std::string::npos);
  }
}

TEST_CASE("a setting spelled outside its documented spellings is refused before fit() trains", "[train]") {
  struct Case {
    const char* name;
    const char* value;
    const char* expected;
  };
  const Case cases[] = {
      {"COHORT_RESTART", "false", "COHORT_RESTART='false': use a whole number, 0 or more (the restart's number, which cohort-launch --restarts sets: 0 is the first run"},
      {"COHORT_HIERARCHICAL_ALLREDUCE", "off", "COHORT_HIERARCHICAL_ALLREDUCE='off': use 1 (on) or 0 (off)"},
      {"COHORT_ALLOW_TF32", "yes", "COHORT_ALLOW_TF32='yes'"},
      {"COHORT_DETERMINISTIC", "fast", "COHORT_DETERMINISTIC='fast'"},
      {"COHORT_PROGRESS", "fancy", "COHORT_PROGRESS='fancy': use bar, lines"},
      {"COHORT_COMMUNICATOR", "MPI", "COHORT_COMMUNICATOR='MPI': use ring, mpi"},
      {"COHORT_GEMM", "foo", "COHORT_GEMM='foo': use eigen, openblas, fastest"},
      {"COHORT_CPU_ISA", "foo", "COHORT_CPU_ISA='foo': use portable, avx2, avx512"},
      {"COHORT_GEMM", "", "COHORT_GEMM='': use eigen, openblas, fastest, or unset it"},
      {"COHORT_CUDA_DEVICE", "zz", "COHORT_CUDA_DEVICE='zz': use a whole number"},
      {"COHORT_TIMOUT", "5", "COHORT_TIMOUT is not a cohort setting: did you mean COHORT_TIMEOUT? Unset it"},
      {"COHORT_TSL", "1", "COHORT_TSL is not a cohort setting: did you mean COHORT_TLS?"},
      {"COHORT_SOMETHING_ELSE_ENTIRELY", "1", "COHORT_SOMETHING_ELSE_ENTIRELY is not a cohort setting (they are COHORT_ROLE, "},
  };
  for (const Case& c : cases) {
    INFO(c.name << "=" << c.value);
    ::setenv(c.name, c.value, 1);
    nn::Sequential model = tiny_cnn();
    const auto before = snapshot(model);
    Trainer trainer(model, optim::SGD());
    CHECK_THROWS_WITH(trainer.fit(synthetic_set(), {.epochs = 1, .batch_size = 32, .verbosity = train::Verbosity::Silent}),
                      Catch::Contains(c.expected));
    CHECK(snapshot(model) == before);
    ::unsetenv(c.name);
  }
  // Two sources of the secret, even in a process that needs none.
  ::setenv("COHORT_SECRET", "0123456789abcdef0123", 1);
  ::setenv("COHORT_SECRET_FILE", "/nonexistent", 1);
  CHECK_THROWS_WITH(check_settings(), Catch::Contains("COHORT_SECRET and COHORT_SECRET_FILE are both set"));
  ::unsetenv("COHORT_SECRET_FILE");
  CHECK_NOTHROW(check_settings());
  ::unsetenv("COHORT_SECRET");
  ::setenv("COHORT_RESTART", "2", 1);  // as cohort-launch --restarts sets it
  CHECK_NOTHROW(check_settings());
  ::unsetenv("COHORT_RESTART");
}

TEST_CASE("without COHORT_GEMM matrix products go through Eigen, whatever a timing would favour", "[train]") {
  // A timed choice flips between runs where the two paths are close, and they round differently.
  if (std::getenv("COHORT_GEMM") != nullptr) {
    WARN("COHORT_GEMM is set");
    return;
  }
  CHECK(gemm_path() == GemmPath::Eigen);
  CHECK_FALSE(gemm_path_named_by_setting());
  ::setenv("COHORT_GEMM", "fastest", 1);
  CHECK_FALSE(gemm_path_named_by_setting());  // a measurement leaves the job's path to the chief's
  CHECK_NOTHROW(check_cpu_kernel_settings());
  ::setenv("COHORT_GEMM", "eigen", 1);
  CHECK(gemm_path_named_by_setting());
  ::unsetenv("COHORT_GEMM");
}

TEST_CASE("checkpoints record the GEMM path, and a resumed run computes through it again", "[train][checkpoint]") {
  // Eigen's and OpenBLAS's products round differently: a run resumed on the other path would not repeat
  // the interrupted one bit for bit.
  if (available_gemm_paths().size() < 2) {
    WARN("this build has Eigen's matrix products only");
    return;
  }
  const GemmPath before = gemm_path();
  ScratchDirectory dir("gemm_path_resume");
  set_gemm_path(GemmPath::OpenBlas);
  nn::Sequential model = tiny_cnn();
  Trainer(model, optim::SGD()).fit(synthetic_set(), {.epochs = 1, .verbosity = train::Verbosity::Silent, .checkpoint_dir = dir.path()});
  nn::Sequential probe = tiny_cnn();
  optim::SGD sgd;
  CHECK(train::load_checkpoint(dir.path() / train::kCheckpointFile, probe, sgd).gemm_path == "openblas");

  set_gemm_path(GemmPath::Eigen);
  nn::Sequential resumed = tiny_cnn();
  Trainer(resumed, optim::SGD()).fit(synthetic_set(), {.epochs = 2, .verbosity = train::Verbosity::Silent,
                                                       .checkpoint_dir = dir.path(), .resume = true});
  CHECK(gemm_path() == GemmPath::OpenBlas);
  set_gemm_path(before);
}

TEST_CASE("checkpoints record the convolution kernels' instruction set, and a resumed run repeats on it", "[train][checkpoint]") {
  // The portable kernels and the AVX2/AVX-512 ones round differently: a run checkpointed on one and resumed
  // on the other would not repeat the uninterrupted run.
  if (cpu_isa_named_by_setting()) {
    WARN("COHORT_CPU_ISA is set");
    return;
  }
  const std::string best(cpu_isa_name());
  if (best == "portable") {
    WARN("this processor runs the portable kernels only");
    return;
  }
  const auto train = [](int epochs, const std::filesystem::path& dir, bool resume) {
    nn::Sequential model = tiny_cnn();
    Trainer(model, optim::SGD()).fit(synthetic_set(), {.epochs = epochs, .verbosity = train::Verbosity::Silent,
                                                       .checkpoint_dir = dir, .resume = resume});
    return snapshot(model);
  };
  ScratchDirectory uninterrupted("cpu_isa_uninterrupted"), interrupted("cpu_isa_interrupted"), other("cpu_isa_other");
  REQUIRE(use_cpu_isa_named("portable"));
  const auto portable = train(2, uninterrupted.path(), false);
  train(1, interrupted.path(), false);
  nn::Sequential probe = tiny_cnn();
  optim::SGD sgd;
  CHECK(train::load_checkpoint(interrupted.path() / train::kCheckpointFile, probe, sgd).cpu_isa == "portable");

  REQUIRE(use_cpu_isa_named(best));
  if (train(2, other.path(), false) == portable) WARN("the portable and " << best << " kernels agree bit for bit on this model");
  const auto resumed = train(2, interrupted.path(), true);
  CHECK(cpu_isa_name() == "portable");
  CHECK(resumed == portable);
  REQUIRE(use_cpu_isa_named(best));
}

TEST_CASE("a resume that finds no checkpoint says that it trains from the start, one of a finished run that nothing is left", "[train][checkpoint]") {
  ScratchDirectory dir("resume_without_checkpoint");
  nn::Sequential model = tiny_cnn();
  test_util::CapturedOutput log(STDERR_FILENO);
  {
    test_util::CapturedOutput progress(STDOUT_FILENO);
    Trainer(model, optim::SGD()).fit(synthetic_set(), {.epochs = 1, .verbosity = train::Verbosity::Lines,
                                                       .checkpoint_dir = dir.path(), .resume = true});
  }
  CHECK_THAT(log.text(), Catch::Contains(fmt::format("no checkpoint in {} to resume from: training from the start", dir.path().string())));
  // Resumed again, the run has nothing left to do, and says so.
  test_util::CapturedOutput again(STDERR_FILENO);
  {
    test_util::CapturedOutput progress(STDOUT_FILENO);
    Trainer(model, optim::SGD()).fit(synthetic_set(), {.epochs = 1, .verbosity = train::Verbosity::Lines,
                                                       .checkpoint_dir = dir.path(), .resume = true});
  }
  CHECK_THAT(again.text(), Catch::Contains(fmt::format("the run in {} has finished its 1 epoch: nothing is left to train",
                                                       dir.path().string())));
}
