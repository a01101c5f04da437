// Captured training steps (FitOptions::capture_steps) on the emulated device, which records as a GPU's stream
// capture does: a fit whose steps are replayed must train bit for bit as the same fit op by op, whatever
// changes between steps (the learning rate, dropout's masks, a pass of the model outside the step).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "cohort/core/timeline.hpp"
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
#include "cohort/tensor/ops.hpp"
#include "cohort/train/trainer.hpp"
#include "test_util.hpp"

using namespace cohort;

namespace {

// 44 samples in batches of 8: five full batches and a partial one per epoch.
const auto kSet = data::make_synthetic({.samples = 44, .sample_shape = {8, 8, 2}, .classes = 4, .seed = 3});

nn::Sequential model_with_everything(Device device) {
  nn::Sequential model({8, 8, 2}, 5, device);
  model.add(nn::Conv2D(8, 3, nn::Padding::Same)).add(nn::BatchNormalization()).add(nn::ReLU());
  model.add(nn::MaxPooling2D(2)).add(nn::Flatten()).add(nn::Dense(6)).add(nn::Dropout(0.3f));
  model.add(nn::Dense(4)).add(nn::Softmax());
  return model;
}

// A layer that reads its input's sum back to the host, as no captured step may, yet says it may be captured.
class ReadsBack : public nn::Layer {
 public:
  std::string type_name() const override { return "ReadsBack"; }
  bool capturable() const override { return true; }
  std::string name_stem() const override { return "reads_back"; }
  Shape build(const Shape& in, nn::VariableFactory&) override { return in; }
  Tensor forward(const Tensor& x, const nn::ForwardContext&) override {
    sums_.push_back(ops::sum(x));
    return x;
  }
  Tensor backward(const Tensor& dy, bool) override { return dy; }

 private:
  std::vector<double> sums_;
};

struct Run {
  nn::Sequential model;
  train::History history;
  std::int64_t captured_steps;  // the "captured step" spans of its timeline
};

std::int64_t captured_spans(const std::filesystem::path& file) {
  std::ifstream in(file);
  REQUIRE(in);
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::int64_t spans = 0;
  for (const auto& event : trace["traceEvents"])
    if (event.value("name", std::string()) == "captured step") ++spans;
  return spans;
}

Run fit_emulated(bool capture, std::unique_ptr<optim::Optimizer> optimizer, const std::function<void(nn::Sequential&)>& add_more,
          std::vector<std::shared_ptr<train::Callback>> callbacks) {
  const test_util::ScratchDirectory dir("capture");
  Run run{model_with_everything(Device::Emulated), {}, 0};
  if (add_more) add_more(run.model);
  Trainer trainer(run.model, std::move(optimizer));
  run.history = trainer.fit(kSet, {.epochs = 2, .batch_size = 8, .seed = 4, .callbacks = std::move(callbacks),
                                   .verbosity = train::Verbosity::Silent, .timeline = dir.path() / "trace.json",
                                   .capture_steps = capture});
  run.captured_steps = captured_spans(dir.path() / "trace.json");
  return run;
}

void require_same_training(const Run& op_by_op, const Run& captured) {
  for (const auto& v : op_by_op.model.variables()) {
    INFO(v->name);
    REQUIRE(v->value.to_vector() == captured.model.variable(v->name)->value.to_vector());
  }
  CHECK(op_by_op.model.step() == captured.model.step());
  REQUIRE(op_by_op.history.epochs.size() == captured.history.epochs.size());
  for (std::size_t e = 0; e < op_by_op.history.epochs.size(); ++e)
    for (const char* key : {"loss", "accuracy"}) CHECK(op_by_op.history.epochs[e].at(key) == captured.history.epochs[e].at(key));
}

}  // namespace

TEST_CASE("captured training steps train bit for bit as op-by-op steps, with a schedule and a callback's rate",
          "[device][train][capture]") {
  const auto optimizer = [](int kind) -> std::unique_ptr<optim::Optimizer> {
    if (kind == 0)
      return std::make_unique<optim::SGD>(optim::SGDOptions{.learning_rate = optim::step_decay(0.1, 0.5, 3), .momentum = 0.9});
    return std::make_unique<optim::Adam>(optim::AdamOptions{.learning_rate = optim::cosine_decay(1e-2, 12)});
  };
  for (int kind : {0, 1}) {
    INFO((kind == 0 ? "SGD, step decay" : "Adam, cosine decay"));
    // A callback that halves the rate after step 4: the recording must take the new rate at its next replay.
    const auto halve_at_four = [] {
      auto callback = std::make_shared<train::LambdaCallback>();
      callback->batch_end = [](std::int64_t step, const train::Logs&, train::TrainingControl& control) {
        if (step == 4) control.set_learning_rate(control.optimizer().learning_rate() / 2);
      };
      return std::vector<std::shared_ptr<train::Callback>>{callback};
    };
    const Run op_by_op = fit_emulated(false, optimizer(kind), {}, halve_at_four());
    const Run captured = fit_emulated(true, optimizer(kind), {}, halve_at_four());
    require_same_training(op_by_op, captured);
    CHECK(op_by_op.captured_steps == 0);
    // Each epoch: the first full batch warms up, the next four are replays, the partial last one runs op by op.
    CHECK(captured.captured_steps == 8);
  }
}

TEST_CASE("a pass of the model between steps drops the recording, and training stays that of op-by-op steps",
          "[device][train][capture]") {
  Trainer* trainer_of_callback = nullptr;
  const auto predicting_after_step_two = [&] {
    auto callback = std::make_shared<train::LambdaCallback>();
    callback->batch_end = [&](std::int64_t step, const train::Logs&, train::TrainingControl&) {
      // Another batch size: the layers make new buffers, which the recording does not use.
      if (step == 2) (void)trainer_of_callback->predict(test_util::random_tensor({3, 8, 8, 2}, 9), 3);
    };
    return std::vector<std::shared_ptr<train::Callback>>{callback};
  };
  std::vector<Run> runs;
  for (bool capture : {false, true}) {
    const test_util::ScratchDirectory dir("capture");
    Run run{model_with_everything(Device::Emulated), {}, 0};
    Trainer trainer(run.model, optim::SGD({.momentum = 0.9}));
    trainer_of_callback = &trainer;
    run.history = trainer.fit(kSet, {.epochs = 1, .batch_size = 8, .seed = 4, .callbacks = predicting_after_step_two(),
                                     .verbosity = train::Verbosity::Silent, .timeline = dir.path() / "trace.json",
                                     .capture_steps = capture});
    run.captured_steps = captured_spans(dir.path() / "trace.json");
    runs.push_back(std::move(run));
  }
  require_same_training(runs[0], runs[1]);
  // Step 1 warms up, step 2 is captured; the prediction after it drops the recording, so step 3 warms up again
  // and steps 4 and 5 are captured and replayed.
  CHECK(runs[1].captured_steps == 3);
}

TEST_CASE("a step that reads values back runs op by op, as the same fit without capture", "[device][train][capture]") {
  // Before the final softmax, which the loss expects last.
  const auto reads_back = [](nn::Sequential& model) {
    nn::Sequential rebuilt({8, 8, 2}, 5, Device::Emulated);
    rebuilt.add(nn::Flatten()).add(ReadsBack()).add(nn::Dense(4)).add(nn::Softmax());
    model = std::move(rebuilt);
  };
  const Run op_by_op = fit_emulated(false, std::make_unique<optim::SGD>(), reads_back, {});
  test_util::CapturedOutput log(STDERR_FILENO);
  const Run tried = fit_emulated(true, std::make_unique<optim::SGD>(), reads_back, {});
  const std::string said = log.text();
  require_same_training(op_by_op, tried);
  CHECK(tried.captured_steps == 0);
  // Said once, with the reason.
  CHECK_THAT(said, Catch::Contains("the training step could not be captured on emulated, so every step runs op by op: "
                                   "sum cannot be captured on emulated: it makes the host wait for the device"));
  CHECK(said.find("could not be captured") == said.rfind("could not be captured"));
}

TEST_CASE("validation and evaluate() replay the recorded evaluation of a full batch, with the op-by-op values",
          "[device][train][capture]") {
  // 1100 samples in batches of 256: four full batches and a partial one.
  const auto validation = data::make_synthetic({.samples = 1100, .sample_shape = {8, 8, 2}, .classes = 4, .seed = 9});
  std::vector<train::History> histories;
  std::vector<train::Logs> evaluations;
  std::vector<std::int64_t> spans;
  for (const bool capture : {false, true}) {
    const test_util::ScratchDirectory dir("capture_evaluation");
    nn::Sequential model = model_with_everything(Device::Emulated);
    Trainer trainer(model, optim::SGD({.momentum = 0.9}), std::make_shared<train::Local>(),
                    {.capture_evaluation = capture});
    histories.push_back(trainer.fit(kSet, {.epochs = 1, .batch_size = 8, .seed = 4, .validation = &validation,
                                           .verbosity = train::Verbosity::Silent, .timeline = dir.path() / "fit.json",
                                           .capture_steps = capture}));
    timeline::start("evaluate");
    evaluations.push_back(trainer.evaluate(validation, 256));
    timeline::stop_and_write(dir.path() / "evaluate.json");
    spans.push_back(captured_spans(dir.path() / "fit.json"));
    spans.push_back(captured_spans(dir.path() / "evaluate.json"));
  }
  for (const char* key : {"loss", "accuracy", "val_loss", "val_accuracy"})
    CHECK(histories[0].epochs.back().at(key) == histories[1].epochs.back().at(key));
  CHECK(evaluations[0] == evaluations[1]);
  CHECK(spans == std::vector<std::int64_t>{0, 0, 4 + 3, 3});  // training: 4 of 6 batches; evaluation: 3 of 5
}

TEST_CASE("a model with a layer that does not say it may be captured trains op by op, and the log names the layer",
          "[device][train][capture]") {
  // A layer of the user's own, computing through ops alone but not declaring itself capturable.
  class Doubles : public nn::Layer {
   public:
    std::string type_name() const override { return "Doubles"; }
    std::string name_stem() const override { return "doubles"; }
    Shape build(const Shape& in, nn::VariableFactory&) override { return in; }
    Tensor forward(const Tensor& x, const nn::ForwardContext&) override {
      reuse(output_, x.shape(), x);
      ops::copy(x, output_);
      ops::scale(output_, 2.0f);
      return output_;
    }
    Tensor backward(const Tensor& dy, bool) override {
      reuse(gradient_, dy.shape(), dy);
      ops::copy(dy, gradient_);
      ops::scale(gradient_, 2.0f);
      return gradient_;
    }

   private:
    Tensor output_, gradient_;
  };
  const auto with_doubles = [](nn::Sequential& model) {
    nn::Sequential rebuilt({8, 8, 2}, 5, Device::Emulated);
    rebuilt.add(nn::Flatten()).add(Doubles()).add(nn::Dense(4)).add(nn::Softmax());
    model = std::move(rebuilt);
  };
  test_util::CapturedOutput log(STDERR_FILENO);
  const test_util::ScratchDirectory dir("capture_uncapturable");
  Run run{model_with_everything(Device::Emulated), {}, 0};
  with_doubles(run.model);
  Trainer trainer(run.model, optim::SGD());
  trainer.fit(kSet, {.epochs = 1, .batch_size = 8, .verbosity = train::Verbosity::Lines,
                     .timeline = dir.path() / "trace.json"});
  const std::string said = log.text();
  CHECK(captured_spans(dir.path() / "trace.json") == 0);
  CHECK_THAT(said, Catch::Contains("layer 'doubles' (Doubles) does not say that it may be captured"));
}
