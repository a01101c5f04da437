#pragma once
// Trainer: fit(), evaluate() and predict() for a Sequential classifier, Keras-style. The loss is
// categorical cross-entropy, fused with a final Softmax layer when the model has one. The same Trainer
// runs single-process (train::Local) or distributed: the Strategy decides the rest.
// Training runs on the model's device: the optimizer's state is moved there, and each batch is copied
// there from pinned host memory on a CopyStream while the previous step computes. predict() takes
// samples on any device and returns its outputs on the host.
//
//   nn::Sequential model({28, 28, 1});  ...
//   Trainer trainer(model, optim::Adam());
//   auto history = trainer.fit(train_set, {.epochs = 5, .batch_size = 64, .validation = &test_set});
//   fmt::print("test accuracy {:.4f}\n", trainer.evaluate(test_set).at("accuracy"));

#include <concepts>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "cohort/data/dataset.hpp"
#include "cohort/data/transforms.hpp"
#include "cohort/nn/sequential.hpp"
#include "cohort/optim/optimizer.hpp"
#include "cohort/train/callbacks.hpp"
#include "cohort/train/checkpoint.hpp"
#include "cohort/train/history.hpp"
#include "cohort/train/strategy.hpp"

namespace cohort::train {

enum class Verbosity { Silent, Auto, Lines };  // Auto: a live bar on a terminal, log lines otherwise

struct FitOptions {
  std::int64_t epochs = 1;
  std::int64_t max_steps = 0;  // > 0: stop after this many optimizer steps in total
  std::int64_t batch_size = 32;
  bool shuffle = true;
  std::uint64_t seed = 0;  // data order and augmentation
  std::vector<data::Transform> transforms;
  const data::Dataset* validation = nullptr;
  std::vector<std::shared_ptr<Callback>> callbacks;
  Verbosity verbosity = Verbosity::Auto;
  // Checkpoints go to checkpoint_dir at the end of every epoch and, when checkpoint_every_steps > 0, every
  // that many steps (latest.ckpt, or the parameter servers' snapshots and ps.manifest); resume continues
  // from the latest one when present, as does a job that cohort-launch --restarts started again.
  std::filesystem::path checkpoint_dir;
  std::int64_t checkpoint_every_steps = 0;
  bool resume = false;
};

class Trainer {
 public:
  template <std::derived_from<optim::Optimizer> O>
  Trainer(nn::Sequential& model, O optimizer, std::shared_ptr<Strategy> strategy = std::make_shared<Local>())
      : Trainer(model, std::unique_ptr<optim::Optimizer>(new O(std::move(optimizer))), std::move(strategy)) {}
  Trainer(nn::Sequential& model, std::unique_ptr<optim::Optimizer> optimizer,
          std::shared_ptr<Strategy> strategy = std::make_shared<Local>());

  History fit(const data::Dataset& train, const FitOptions& options);
  // Mean loss and accuracy over a data set, in inference mode.
  Logs evaluate(const data::Dataset& dataset, std::int64_t batch_size = 256);
  // Model outputs (N, classes) for a batch of samples, in inference mode.
  Tensor predict(const Tensor& images, std::int64_t batch_size = 256);

  optim::Optimizer& optimizer() { return *optimizer_; }
  nn::Sequential& model() { return model_; }

 private:
  // One forward/backward/update on a batch; returns (loss, correct predictions).
  std::pair<double, std::int64_t> train_step(const Tensor& images, const Tensor& labels);

  nn::Sequential& model_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::shared_ptr<Strategy> strategy_;
  Tensor output_gradient_;
};

}  // namespace cohort::train

namespace cohort {
using train::Trainer;
}  // namespace cohort
