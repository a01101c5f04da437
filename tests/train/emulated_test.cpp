// The emulated device runs the CPU kernels on storage host code may not touch. Everything a model does
// (layers, optimizers, fit/evaluate/predict, checkpoints, both distributed strategies) must give the
// CPU's results bitwise there: any difference, or any DeviceError, is a missing transfer or a host
// access on a device path.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "cohort/comm/inproc.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/synthetic.hpp"
#include "cohort/nn/activation_layer.hpp"
#include "cohort/nn/batch_normalization.hpp"
#include "cohort/nn/conv2d.hpp"
#include "cohort/nn/dense.hpp"
#include "cohort/nn/dropout.hpp"
#include "cohort/nn/flatten.hpp"
#include "cohort/nn/pooling2d.hpp"
#include "cohort/nn/zoo.hpp"
#include "cohort/optim/adam.hpp"
#include "cohort/optim/rmsprop.hpp"
#include "cohort/optim/sgd.hpp"
#include "cohort/tensor/ops.hpp"
#include "cohort/train/checkpoint.hpp"
#include "cohort/train/ring_allreduce.hpp"
#include "cohort/train/trainer.hpp"
#include "cohort/train/update.hpp"
#include "comm/comm_test_util.hpp"
#include "tensor/cpu/recording_backend.hpp"
#include "ps/ps_test_util.hpp"
#include "test_util.hpp"

using namespace cohort;

namespace {

const auto kSet = data::make_synthetic({.samples = 44, .sample_shape = {8, 8, 2}, .classes = 4, .seed = 3});

void require_equal(const Tensor& cpu, const Tensor& emulated, const std::string& what) {
  INFO(what);
  REQUIRE(cpu.device() == Device::CPU);
  REQUIRE(emulated.device() == Device::Emulated);
  REQUIRE(cpu.to_vector() == emulated.to_vector());
}

void require_same_variables(const nn::Sequential& cpu, const nn::Sequential& emulated) {
  for (const auto& v : cpu.variables()) require_equal(v->value, emulated.variable(v->name)->value, v->name);
}

nn::Sequential full_model(Device device) {
  nn::Sequential model({8, 8, 2}, 5, device);
  model.add(nn::Conv2D(8, 3, nn::Padding::Same)).add(nn::BatchNormalization()).add(nn::ReLU());
  model.add(nn::Conv2D(8, 3, nn::Padding::Same)).add(nn::ReLU()).add(nn::AveragePooling2D(2));
  model.add(nn::MaxPooling2D(2)).add(nn::Flatten()).add(nn::Dense(6)).add(nn::Dropout(0.3f));
  model.add(nn::Dense(4)).add(nn::Softmax());
  return model;
}

// The events of a timeline written by fit().
nlohmann::json trace_events(const std::filesystem::path& trace) {
  std::ifstream in(trace);
  REQUIRE(in);
  return nlohmann::json::parse(in)["traceEvents"];
}

// Two data-parallel replicas of full_model on `device`, five steps; make_strategy gives each rank's strategy
// from its transport.
std::vector<nn::Sequential> train_two_replicas(
    Device device, const std::function<std::shared_ptr<train::Strategy>(comm::Transport&)>& make_strategy) {
  comm::InProcessGroup group(2);
  std::vector<nn::Sequential> models;
  models.push_back(full_model(device));
  models.push_back(full_model(device));
  comm_test::run_ranks(2, [&](int r) {
    Trainer trainer(models[static_cast<std::size_t>(r)], optim::SGD({.momentum = 0.9}), make_strategy(group.transport(r)));
    trainer.fit(kSet, {.epochs = 100, .max_steps = 5, .batch_size = 8, .seed = 4, .verbosity = train::Verbosity::Silent});
  });
  return models;
}

}  // namespace

TEST_CASE("every layer computes the same forward and backward on the emulated device", "[device][nn]") {
  using Factory = std::function<std::unique_ptr<nn::Layer>()>;
  const std::vector<std::pair<std::string, Factory>> layers = {
      {"conv same", [] { return std::make_unique<nn::Conv2D>(8, 3, nn::Padding::Same); }},
      {"conv valid stride 2", [] { return std::make_unique<nn::Conv2D>(3, 3, nn::Padding::Valid, 2); }},
      {"conv 1x1 no bias", [] { return std::make_unique<nn::Conv2D>(4, 1, nn::Padding::Valid, 1, false); }},
      {"dense", [] { return std::make_unique<nn::Dense>(5); }},
      {"batch norm", [] { return std::make_unique<nn::BatchNormalization>(); }},
      {"relu", [] { return std::make_unique<nn::ActivationLayer>(nn::ReLU()); }},
      {"sigmoid", [] { return std::make_unique<nn::ActivationLayer>(nn::Activation(cohort::Activation::Sigmoid)); }},
      {"tanh", [] { return std::make_unique<nn::ActivationLayer>(nn::Activation(cohort::Activation::Tanh)); }},
      {"softmax", [] { return std::make_unique<nn::ActivationLayer>(nn::Softmax()); }},
      {"max pooling", [] { return std::make_unique<nn::MaxPooling2D>(2); }},
      {"average pooling same", [] { return std::make_unique<nn::AveragePooling2D>(3, 2, nn::Padding::Same); }},
      {"dropout", [] { return std::make_unique<nn::Dropout>(0.4f); }},
      {"flatten", [] { return std::make_unique<nn::Flatten>(); }},
  };
  const Shape sample{7, 6, 8};
  for (const auto& [name, make] : layers) {
    for (bool training : {true, false}) {
      INFO(name << (training ? " training" : " inference"));
      auto cpu = make(), emulated = make();
      cpu->set_name("layer");
      emulated->set_name("layer");
      nn::VariableFactory cpu_factory("layer", 9, 0, Device::CPU), emulated_factory("layer", 9, 0, Device::Emulated);
      const Shape out = cpu->build(sample, cpu_factory);
      REQUIRE(emulated->build(sample, emulated_factory) == out);
      for (std::size_t i = 0; i < cpu->variables().size(); ++i)
        require_equal(cpu->variables()[i]->value, emulated->variables()[i]->value, "initial " + cpu->variables()[i]->name);
      const Tensor x = test_util::random_tensor(sample.batched(3), 11);
      const Tensor dy = test_util::random_tensor(out.batched(3), 12);
      const nn::ForwardContext context{training, 4};
      require_equal(cpu->forward(x, context), emulated->forward(x.to(Device::Emulated), context), "forward");
      require_equal(cpu->backward(dy, true), emulated->backward(dy.to(Device::Emulated), true), "input gradient");
      for (std::size_t i = 0; i < cpu->variables().size(); ++i) {
        const auto& v = cpu->variables()[i];
        if (v->trainable) require_equal(v->gradient, emulated->variables()[i]->gradient, "gradient of " + v->name);
        else require_equal(v->value, emulated->variables()[i]->value, "statistics " + v->name);
      }
    }
  }
}

TEST_CASE("every optimizer updates identically on the emulated device", "[device][optim]") {
  using Factory = std::function<std::unique_ptr<optim::Optimizer>()>;
  const std::vector<std::pair<std::string, Factory>> optimizers = {
      {"sgd", [] { return std::make_unique<optim::SGD>(); }},
      {"nesterov", [] { return std::make_unique<optim::SGD>(optim::SGDOptions{.momentum = 0.9, .nesterov = true, .weight_decay = 1e-3}); }},
      {"adam", [] { return std::make_unique<optim::Adam>(); }},
      {"rmsprop", [] { return std::make_unique<optim::RMSprop>(optim::RMSpropOptions{.momentum = 0.5, .centered = true}); }},
  };
  for (const auto& [name, make] : optimizers) {
    INFO(name);
    auto cpu = make(), emulated = make();
    const Tensor value = test_util::random_tensor({17, 3}, 1);
    const Tensor on_device = value.to(Device::Emulated);
    for (int step = 0; step < 3; ++step) {
      const Tensor gradient = test_util::random_tensor({17, 3}, 20 + static_cast<std::uint64_t>(step));
      cpu->apply("w", value, gradient);
      emulated->apply("w", on_device, gradient.to(Device::Emulated));
      cpu->finish_step();
      emulated->finish_step();
    }
    require_equal(value, on_device, "value");
    for (std::size_t s = 0; s < cpu->state().at("w").slots.size(); ++s)
      require_equal(cpu->state().at("w").slots[s], emulated->state().at("w").slots[s], "slot");
  }
}

TEST_CASE("fit, evaluate and predict on the emulated device equal the CPU's", "[device][train]") {
  const auto test_set = data::make_synthetic({.samples = 20, .sample_shape = {8, 8, 2}, .classes = 4, .seed = 8});
  std::vector<train::History> histories;
  std::vector<train::Logs> evaluations;
  std::vector<nn::Sequential> models;
  for (Device device : {Device::CPU, Device::Emulated}) {
    models.push_back(full_model(device));
    Trainer trainer(models.back(), optim::Adam());
    histories.push_back(trainer.fit(kSet, {.epochs = 2, .batch_size = 8, .seed = 4, .validation = &test_set,
                                           .verbosity = train::Verbosity::Silent}));
    evaluations.push_back(trainer.evaluate(test_set, 7));
  }
  require_same_variables(models[0], models[1]);
  REQUIRE(histories[0].epochs.size() == 2);
  for (std::size_t e = 0; e < 2; ++e)
    for (const char* key : {"loss", "accuracy", "val_loss", "val_accuracy"})
      CHECK(histories[0].epochs[e].at(key) == histories[1].epochs[e].at(key));
  CHECK(evaluations[0] == evaluations[1]);
  const Tensor images = test_util::random_tensor({9, 8, 8, 2}, 3);
  Trainer cpu(models[0], optim::Adam()), emulated(models[1], optim::Adam());
  const Tensor on_host = emulated.predict(images, 4);
  CHECK(on_host.device() == Device::CPU);
  CHECK(cpu.predict(images, 4).to_vector() == on_host.to_vector());
  // In the same batches: a GEMM may round a row differently with another number of rows around it.
  CHECK(emulated.predict(images.to(Device::Emulated), 4).to_vector() == on_host.to_vector());
}

TEST_CASE("an image augmentation expanded on the device trains as its transforms on the host", "[device][train][data]") {
  const data::ImageAugmentation augmentation{
      .crop_padding = 2, .flip_horizontal = true, .mean = {0.45f, 0.55f}, .stddev = {0.25f, 0.2f}};
  std::string said;  // what the last run logged
  const auto train = [&](Device device, train::FitOptions options) {
    options.epochs = 2;
    options.batch_size = 8;
    options.seed = 4;
    options.verbosity = train::Verbosity::Epochs;
    nn::Sequential model = full_model(device);
    test_util::CapturedOutput log(STDERR_FILENO);
    Trainer(model, optim::Adam()).fit(kSet, options);
    said = log.text();
    return model;
  };
  // The device takes 8-bit batches and expands them itself; the CPU runs the host transforms.
  const nn::Sequential host = train(Device::CPU, {.transforms = data::transforms_of(augmentation)});
  CHECK_THAT(said, !Catch::Contains("images:"));
  require_same_variables(host, train(Device::Emulated, {.augmentation = augmentation}));
  CHECK_THAT(said, Catch::Contains("images: copied to emulated as 8-bit values, cropped at random within 2 pixels of "
                                   "padding, flipped at random, normalized there"));
  // The same with the training set resident on the device and batches of sample indices.
  require_same_variables(host, train(Device::Emulated, {.augmentation = augmentation, .resident_images = true}));
  CHECK_THAT(said, Catch::Contains("images: the training set's 0.01 MiB of 8-bit values resident on emulated"));
  // Where the device's draws or normalization differed, so would the variables.
  data::ImageAugmentation unflipped = augmentation;
  unflipped.flip_horizontal = false;
  const nn::Sequential other = train(Device::Emulated, {.augmentation = unflipped});
  CHECK(host.variable("dense/kernel")->value.to_vector() != other.variable("dense/kernel")->value.to_vector());
  CHECK_THROWS_WITH(train(Device::Emulated, {.transforms = {data::random_flip_horizontal()}, .augmentation = augmentation}),
                    Catch::Contains("both transforms and an image augmentation"));
  CHECK_THROWS_WITH(train(Device::Emulated, {.resident_images = true}), Catch::Contains("none was given"));
  // On the CPU the description runs as host transforms, and the log says so.
  const nn::Sequential described = train(Device::CPU, {.augmentation = augmentation, .resident_images = true});
  CHECK_THAT(said, Catch::Contains("normalized on the loader's thread (resident images are for a device"));
  require_same_variables(described, train(Device::Emulated, {.augmentation = augmentation}));
}

TEST_CASE("training on a device charts its memory per step on the timeline and logs each epoch's step peak",
          "[device][train][timeline]") {
  test_util::ScratchDirectory directory("device_memory");
  const auto counters_of = [](const std::filesystem::path& trace) {
    std::vector<nlohmann::json> counters;
    for (const auto& event : trace_events(trace))
      if (event["ph"] == "C" && event["name"] == "device memory (MiB)") counters.push_back(event["args"]);
    return counters;
  };
  for (Device device : {Device::Emulated, Device::CPU}) {
    INFO(device_name(device));
    nn::Sequential model = full_model(device);
    Trainer trainer(model, optim::Adam());
    test_util::CapturedOutput log(STDERR_FILENO);
    trainer.fit(kSet, {.epochs = 2, .batch_size = 8, .seed = 4, .verbosity = train::Verbosity::Epochs,
                       .timeline = directory.path() / "trace.json"});
    const std::string text = log.text();
    const std::vector<nlohmann::json> counters = counters_of(directory.path() / "trace.json");
    std::size_t lines = 0;
    for (std::size_t at = 0; (at = text.find("emulated memory: at most ", at)) != std::string::npos; ++at) ++lines;
    if (device == Device::CPU) {  // host memory is no device's
      CHECK(lines == 0);
      CHECK(counters.empty());
      continue;
    }
    CHECK(lines == 2);
    REQUIRE(counters.size() == 2 * 6);  // 44 samples in batches of 8: 6 steps an epoch
    for (const auto& sample : counters) {
      CHECK(sample["in use"].get<double>() > 0.0);
      CHECK(sample["step peak"].get<double>() >= sample["in use"].get<double>());
      CHECK(sample["reserved"].get<double>() >= sample["in use"].get<double>());
    }
  }
}

TEST_CASE("on a device, fit reads the loss and metrics only where they are shown or a callback reads them",
          "[device][train][timeline]") {
  test_util::ScratchDirectory directory("device_reads");
  const auto reads_in = [](const std::filesystem::path& trace) {
    std::size_t reads = 0;
    for (const auto& event : trace_events(trace))
      reads += event["ph"] == "X" && event["name"] == "read loss and metrics" ? 1 : 0;
    return reads;
  };
  // Two epochs of 6 steps each, over `callbacks`; returns the reads.
  const auto train = [&](Device device, const std::vector<std::shared_ptr<train::Callback>>& callbacks,
                         train::History* history = nullptr, std::int64_t checkpoint_every_steps = 0) {
    nn::Sequential model = full_model(device);
    Trainer trainer(model, optim::Adam());
    const train::History result = trainer.fit(
        kSet, {.epochs = 2, .batch_size = 8, .seed = 4, .callbacks = callbacks, .verbosity = train::Verbosity::Silent,
               .checkpoint_dir = checkpoint_every_steps > 0 ? directory.path() / "checkpoints" : std::filesystem::path(),
               .checkpoint_every_steps = checkpoint_every_steps, .timeline = directory.path() / "trace.json"});
    if (history != nullptr) *history = result;
    return reads_in(directory.path() / "trace.json");
  };
  std::vector<train::Logs> seen;
  const auto recorder = std::make_shared<train::LambdaCallback>();
  recorder->batch_end = [&](std::int64_t, const train::Logs& logs, train::TrainingControl&) { seen.push_back(logs); };
  struct Overrider : train::Callback {  // overrides on_batch_end, so it is given the loss at every step
    std::size_t with_loss = 0;
    void on_batch_end(std::int64_t, const train::Logs& logs, train::TrainingControl&) override {
      with_loss += logs.contains("loss") ? 1 : 0;
    }
  };
  struct Counter : Overrider {  // says it reads no logs
    bool needs_batch_logs(std::int64_t) const override { return false; }
  };
  train::History quiet_history, read_history, cpu_history;
  // Silent and without a callback that reads them: once per epoch, at its end.
  const auto counter = std::make_shared<Counter>();
  CHECK(train(Device::Emulated, {counter}, &quiet_history) == 2);
  CHECK(counter->with_loss == 0);
  // The CPU reads every step, and still gives batch logs only as a device would; so does a run whose progress
  // bar reads them to draw.
  counter->with_loss = 0;
  train(Device::CPU, {counter});
  CHECK(counter->with_loss == 0);
  {
    test_util::CapturedOutput bar(STDOUT_FILENO);
    nn::Sequential model = full_model(Device::Emulated);
    Trainer(model, optim::Adam()).fit(kSet, {.epochs = 1, .batch_size = 8, .callbacks = {counter},
                                             .verbosity = train::Verbosity::Lines});
    CHECK_THAT(bar.text(), Catch::Contains("loss: "));
  }
  CHECK(counter->with_loss == 0);
  // A checkpoint every 4 steps reads them first (steps 4, 8 and 12), so as not to save a run whose loss went bad.
  CHECK(train(Device::Emulated, {}, nullptr, 4) == 2 + 3);
  // A plain callback costs one read, at the first step, until its on_batch_end shows that it is not overridden.
  CHECK(train(Device::Emulated, {std::make_shared<train::Callback>()}) == 3);
  // A callback reading batch logs makes every step read them; they hold this epoch's running loss.
  CHECK(train(Device::Emulated, {recorder}, &read_history) == 2 * 6 + 2);
  REQUIRE(seen.size() == 12);
  for (const auto& logs : seen) CHECK((logs.contains("loss") && logs.contains("accuracy") && logs.contains("learning_rate")));
  CHECK(seen[5].at("loss") == quiet_history.epochs[0].at("loss"));
  const auto overrider = std::make_shared<Overrider>();
  CHECK(train(Device::Emulated, {overrider}) == 2 * 6 + 2);
  CHECK(overrider->with_loss == 12);
  // Where the sums were read makes no difference to them, nor does the device.
  train(Device::CPU, {}, &cpu_history);
  for (const char* key : {"loss", "accuracy"})
    for (std::size_t e = 0; e < 2; ++e) {
      CHECK(quiet_history.epochs[e].at(key) == read_history.epochs[e].at(key));
      CHECK(quiet_history.epochs[e].at(key) == cpu_history.epochs[e].at(key));
    }
  // A diverging run says between which steps its loss stopped being finite.
  nn::Sequential model = full_model(Device::Emulated);
  Trainer diverging(model, optim::SGD({.learning_rate = optim::constant(1e30)}));
  CHECK_THROWS_WITH(diverging.fit(kSet, {.epochs = 2, .batch_size = 8, .verbosity = train::Verbosity::Silent}),
                    Catch::Contains("the training loss became") && Catch::Contains("between steps 0 and 5"));
  // Under mixed_float16 each step's loss is read (its loss scale waits for the step anyway): the error names
  // the overflow rather than a loss scale that gave up after skipping every step.
  nn::Sequential mixed = full_model(Device::Emulated);
  mixed.set_precision(nn::Precision::MixedFloat16);
  Trainer overflowing(mixed, optim::SGD({.learning_rate = optim::constant(1e30)}));
  CHECK_THROWS_WITH(overflowing.fit(kSet, {.epochs = 2, .batch_size = 8, .verbosity = train::Verbosity::Silent}),
                    Catch::Contains("the training loss became") && Catch::Contains("activations overflow float16"));
}

TEST_CASE("on a device, every loss and metric sums there: reads back to the host do not grow with the steps",
          "[device][train]") {
  const auto& emulated = dynamic_cast<const cpu::RecordingBackend&>(backend_for(Device::Emulated)).kernels();
  const auto two_classes = data::make_synthetic({.samples = 44, .sample_shape = {8, 8, 2}, .classes = 2, .seed = 6});
  // A Dense layer of `outputs` on the flattened samples, then a sigmoid when asked.
  const auto dense = [](int outputs, bool sigmoid) {
    return [=](Device device) {
      nn::Sequential model({8, 8, 2}, 5, device);
      model.add(nn::Flatten()).add(nn::Dense(outputs));
      if (sigmoid) model.add(nn::Sigmoid());
      return model;
    };
  };
  struct Case {
    const char* name;
    std::function<nn::Sequential(Device)> model;
    nn::Loss loss;
    std::vector<nn::Metric> metrics;
    const data::Dataset* set;
  };
  const std::vector<Case> cases = {
      {"mse", dense(1, false), nn::MeanSquaredError{}, {"mae", "mse"}, &kSet},
      {"mae", dense(1, false), nn::MeanAbsoluteError{}, {"mse"}, &kSet},
      {"bce", dense(1, true), nn::BinaryCrossentropy{}, {"accuracy", "mae"}, &two_classes},
      {"bce of logits", dense(1, false), nn::BinaryCrossentropy{.from_logits = true}, {"accuracy"}, &two_classes},
      {"top-k", dense(4, false), nn::SparseCategoricalCrossentropy{.from_logits = true}, {"top_2_accuracy"}, &kSet},
      {"convolutions, batch normalization, dropout", full_model, nn::SparseCategoricalCrossentropy{}, {"accuracy"}, &kSet}};
  for (const Case& c : cases) {
    INFO(c.name);
    // One epoch in 6 steps of 8 samples, or in 11 of 4, validated in as many batches, then evaluated; returns
    // the epoch's logs and the reads that fit() and evaluate() took.
    const auto train = [&](Device device, std::int64_t batch_size) {
      nn::Sequential model = c.model(device);
      Trainer trainer(model, optim::Adam(), std::make_shared<train::Local>(), {.loss = c.loss, .metrics = c.metrics});
      const std::uint64_t before = emulated.copies_to_host();
      const train::Logs logs = trainer.fit(*c.set, {.epochs = 1, .batch_size = batch_size, .seed = 4, .validation = c.set,
                                                    .verbosity = train::Verbosity::Silent})
                                   .epochs.back();
      trainer.evaluate(*c.set, batch_size);
      return std::pair{logs, emulated.copies_to_host() - before};
    };
    const auto [logs, reads] = train(Device::Emulated, 8);
    CHECK(train(Device::Emulated, 4).second == reads);
    const train::Logs on_cpu = train(Device::CPU, 8).first;
    for (const std::string prefix : {"", "val_"}) {
      CHECK(on_cpu.at(prefix + "loss") == logs.at(prefix + "loss"));
      for (const nn::Metric& metric : c.metrics) CHECK(on_cpu.at(prefix + metric.name()) == logs.at(prefix + metric.name()));
    }
  }
}

TEST_CASE("a replica whose loss goes bad on a device stops the others before they save its gradients",
          "[device][distributed]") {
  // kSet's samples made infinite: the replica that trains on them has a loss that is not finite at once.
  struct Overflowing : data::Dataset {
    std::int64_t size() const override { return kSet.size(); }
    Shape sample_shape() const override { return kSet.sample_shape(); }
    int num_classes() const override { return kSet.num_classes(); }
    int load(std::int64_t index, float* out) const override {
      const int label = kSet.load(index, out);
      std::fill_n(out, sample_shape().numel(), std::numeric_limits<float>::infinity());
      return label;
    }
    std::string description() const override { return "overflowing"; }
  } overflowing;
  test_util::ScratchDirectory directory("bad_replica");
  comm::InProcessGroup group(2);
  std::vector<nn::Sequential> models;  // no ReLU, which would turn the NaN of infinite inputs into zeros
  for (int r = 0; r < 2; ++r) {
    models.emplace_back(kSet.sample_shape(), 1, Device::Emulated);
    models.back().add(nn::Flatten()).add(nn::Dense(4)).add(nn::Softmax());
  }
  std::vector<std::string> errors(2);
  comm_test::run_ranks(2, [&](int r) {
    Trainer trainer(models[static_cast<std::size_t>(r)], optim::SGD(),
                    std::make_shared<train::RingAllreduce>(group.transport(r)));
    try {
      trainer.fit(r == 1 ? static_cast<const data::Dataset&>(overflowing) : kSet,
                  {.epochs = 1, .batch_size = 8, .seed = 4, .verbosity = train::Verbosity::Silent,
                   .checkpoint_dir = directory.path() / "checkpoints", .checkpoint_every_steps = 1});
    } catch (const std::exception& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  CHECK_THAT(errors[1], Catch::Contains("the training loss became") && Catch::Contains("at step 0"));
  CHECK_FALSE(errors[0].empty());
  // Rank 1's gradients reached rank 0's variables in step 0; no checkpoint holds them.
  std::vector<std::string> saved;
  if (std::filesystem::exists(directory.path() / "checkpoints"))
    for (const auto& entry : std::filesystem::recursive_directory_iterator(directory.path() / "checkpoints"))
      saved.push_back(entry.path().filename().string());
  CHECK(saved.empty());
}

TEST_CASE("a model moved with to() trains on its new device, checkpoints cross devices", "[device][train]") {
  test_util::ScratchDirectory directory("emulated_checkpoint");
  const auto path = directory.path() / "latest.ckpt";
  nn::Sequential reference = full_model(Device::CPU);
  Trainer continuous(reference, optim::Adam());
  continuous.fit(kSet, {.epochs = 100, .max_steps = 8, .batch_size = 8, .seed = 4, .verbosity = train::Verbosity::Silent});

  // Emulated for 4 steps, saved, resumed on the CPU, saved, resumed on the emulated device again.
  nn::Sequential first = full_model(Device::CPU);
  first.to(Device::Emulated);
  REQUIRE(first.variable("dense/kernel")->value.device() == Device::Emulated);
  Trainer trainer(first, optim::Adam());
  trainer.fit(kSet, {.epochs = 100, .max_steps = 4, .batch_size = 8, .seed = 4, .verbosity = train::Verbosity::Silent,
                     .checkpoint_dir = directory.path()});
  // Other initial values: only a working resume can make the end result equal the continuous run's.
  nn::Sequential second = full_model(Device::CPU);
  ops::fill(second.variable("dense/kernel")->value, 0.5f);
  Trainer resumed(second, optim::Adam());
  resumed.fit(kSet, {.epochs = 100, .max_steps = 6, .batch_size = 8, .seed = 4, .verbosity = train::Verbosity::Silent,
                     .checkpoint_dir = directory.path(), .resume = true});
  nn::Sequential third = full_model(Device::Emulated);
  ops::fill(third.variable("dense/kernel")->value, 0.5f);
  Trainer last(third, optim::Adam());
  last.fit(kSet, {.epochs = 100, .max_steps = 8, .batch_size = 8, .seed = 4, .verbosity = train::Verbosity::Silent,
                  .checkpoint_dir = directory.path(), .resume = true});
  require_same_variables(reference, third);
  CHECK(last.optimizer().iterations() == 8);
  CHECK(last.optimizer().state().at("dense/kernel").slots[0].device() == Device::Emulated);
}

TEST_CASE("host access and device mix-ups on a device path fail with DeviceError", "[device][train]") {
  // A layer that reads its input on the host works on the CPU and is caught on the emulated device.
  struct HostPeekingLayer : nn::Layer {
    std::string type_name() const override { return "HostPeeking"; }
    std::string name_stem() const override { return "host_peeking"; }
    Shape build(const Shape& in, nn::VariableFactory&) override { return in; }
    Tensor forward(const Tensor& x, const nn::ForwardContext&) override {
      if (x.numel() > 0 && x.data()[0] > 1e30f) return {};
      return x;
    }
    Tensor backward(const Tensor& dy, bool) override { return dy; }
  };
  for (Device device : {Device::CPU, Device::Emulated}) {
    nn::Sequential model({4}, 0, device);
    model.add(nn::Dense(3)).add(std::make_unique<HostPeekingLayer>()).add(nn::Softmax());
    const Tensor batch = Tensor({2, 4}).to(device);
    if (device == Device::CPU) CHECK_NOTHROW(model.forward(batch));
    else CHECK_THROWS_AS(model.forward(batch), DeviceError);
  }
  nn::Sequential model = full_model(Device::Emulated);
  CHECK_THROWS_AS(model.variable("dense/kernel")->value.values(), DeviceError);
  CHECK_THROWS_WITH(model.forward(Tensor({2, 8, 8, 2})), Catch::Contains("the model is on emulated"));
  // Optimizer state left on the CPU while the model moved: named, not silently mixed.
  nn::Sequential cpu_model = full_model(Device::CPU);
  optim::Adam adam;
  train::update_variables(adam, cpu_model.trainable_variables());
  cpu_model.to(Device::Emulated);
  CHECK_THROWS_WITH(train::update_variables(adam, cpu_model.trainable_variables()),
                    Catch::Contains("is on cpu, the variable on emulated"));
  adam.to(Device::Emulated);
  CHECK_NOTHROW(train::update_variables(adam, cpu_model.trainable_variables()));
}

TEST_CASE("ring-allreduce training on the emulated device equals the same run on the CPU", "[device][distributed]") {
  // Plain, and sharded (zero2: the reduce-scatter and the allgather of the pieces through pinned host memory).
  for (int stage : {0, 2}) {
    INFO("zero stage " << stage);
    std::vector<std::vector<nn::Sequential>> runs;
    for (Device device : {Device::CPU, Device::Emulated})
      runs.push_back(train_two_replicas(device, [stage](comm::Transport& transport) {
        return std::make_shared<train::RingAllreduce>(transport, train::RingAllreduceOptions{.zero_stage = stage});
      }));
    require_same_variables(runs[0][0], runs[1][0]);
    require_same_variables(runs[0][1], runs[1][1]);
  }
}

TEST_CASE("parameter-server training of emulated workers equals the same run on the CPU", "[device][ps]") {
  std::vector<std::vector<nn::Sequential>> runs;
  for (Device device : {Device::CPU, Device::Emulated}) {
    comm::InProcessGroup group(4);
    std::vector<nn::Sequential> models;
    for (int r = 0; r < 4; ++r) models.push_back(full_model(r < 2 ? device : Device::CPU));  // servers stay on the CPU
    ps_test::run_cluster(group, 2, 2, {}, [&](int r, auto strategy) {
      Trainer trainer(models[static_cast<std::size_t>(r)], optim::Adam(), strategy);
      trainer.fit(kSet, {.epochs = 100, .max_steps = 5, .batch_size = 8, .seed = 4, .verbosity = train::Verbosity::Silent});
    });
    runs.push_back(std::move(models));
  }
  require_same_variables(runs[0][0], runs[1][0]);
  require_same_variables(runs[0][1], runs[1][1]);
}

TEST_CASE("ring allreduce picks the communicator that accepts the gradients' device", "[device][distributed]") {
  // Stands in for a device's own collective library (NCCL): it takes emulated buffers and, since emulated
  // memory is host memory underneath, lets the ring reduce them.
  struct EmulatedCollectives : comm::Communicator {
    std::shared_ptr<comm::Communicator> ring;
    std::atomic<int>& calls;
    EmulatedCollectives(std::shared_ptr<comm::Communicator> r, std::atomic<int>& counter)
        : ring(std::move(r)), calls(counter) {}
    std::string name() const override { return "emulated-collectives"; }
    int rank() const override { return ring->rank(); }
    int size() const override { return ring->size(); }
    bool accepts(Device device) const override { return device == Device::Emulated; }
    std::chrono::milliseconds timeout() const override { return ring->timeout(); }
    void expect_buffers_up_to(std::uint64_t bytes) override { ring->expect_buffers_up_to(bytes); }
    void announce_failure(const std::string& reason) override { ring->announce_failure(reason); }
    static comm::Buffer on_host(comm::Buffer b) {
      b.device = Device::CPU;
      return b;
    }
    comm::WorkPtr allreduce(comm::Buffer data, comm::ReduceOp op) override {
      ++calls;
      return ring->allreduce(on_host(data), op);
    }
    comm::WorkPtr broadcast(comm::Buffer data, int root) override {
      ++calls;
      return ring->broadcast(on_host(data), root);
    }
    comm::WorkPtr allgather(comm::Buffer mine, comm::Buffer all) override {
      ++calls;
      return ring->allgather(on_host(mine), on_host(all));
    }
    comm::WorkPtr reduce_scatter(comm::Buffer data, comm::ReduceOp op) override {
      ++calls;
      return ring->reduce_scatter(on_host(data), op);
    }
  };
  std::vector<std::vector<nn::Sequential>> runs;
  for (Device device : {Device::CPU, Device::Emulated}) {
    std::atomic<int> device_calls{0};
    runs.push_back(train_two_replicas(device, [&](comm::Transport& transport) {
      std::shared_ptr<comm::Communicator> ring = comm::make_ring_communicator(transport);
      auto collectives = std::make_shared<EmulatedCollectives>(ring, device_calls);
      return std::make_shared<train::RingAllreduce>(std::vector<std::shared_ptr<comm::Communicator>>{ring, collectives});
    }));
    // Emulated gradients go to the collectives that take them, host ones to the ring.
    if (device == Device::CPU) CHECK(device_calls == 0);
    else CHECK(device_calls > 0);
  }
  require_same_variables(runs[0][0], runs[1][0]);
}

TEST_CASE("the flagship CIFAR-10 model moved to the emulated device trains as on the CPU", "[device][train]") {
  const auto images = data::make_synthetic({.samples = 12, .sample_shape = {32, 32, 3}, .classes = 10, .seed = 6});
  std::vector<nn::Sequential> models;
  for (Device device : {Device::CPU, Device::Emulated}) {
    models.push_back(nn::cifar10_cnn({32, 32, 3}, 1));
    models.back().to(device);
    Trainer trainer(models.back(), optim::Adam());
    trainer.fit(images, {.epochs = 100, .max_steps = 2, .batch_size = 6, .seed = 1, .verbosity = train::Verbosity::Silent});
  }
  require_same_variables(models[0], models[1]);
}
