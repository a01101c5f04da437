#pragma once
// Strategy: how a Trainer shares one training run among processes. The Trainer's loop is the same for
// every strategy; a strategy decides where variables start from, how gradients become updates, which
// share of each epoch this process reads, and which process is the chief (validation, logs, checkpoints).
// Local is the single-process strategy; distributed strategies implement the same interface.
//
//   Trainer trainer(model, optim::Adam(), std::make_shared<train::Local>());

#include <cstdint>
#include <memory>
#include <string>

#include "cohort/data/sampler.hpp"
#include "cohort/nn/sequential.hpp"
#include "cohort/optim/optimizer.hpp"

namespace cohort::train {

// Which share of each epoch this process reads (data::LoaderOptions::replica/replicas), and an offset
// for its data seed (non-zero when every process reads the whole set in its own order).
struct DataShare {
  int replica = 0;
  int replicas = 1;
  std::uint64_t seed_offset = 0;
};

class Strategy {
 public:
  virtual ~Strategy() = default;

  virtual std::string name() const = 0;
  // Number of processes that compute gradients: the global batch is replicas() x per-replica batch.
  virtual int replicas() const = 0;
  virtual bool is_chief() const = 0;
  // Brings the model's variables to their starting values (the chief's, in a distributed run).
  virtual void initialize(nn::Sequential& model, optim::Optimizer& optimizer) = 0;
  // Turns the gradients held by the model's trainable variables, computed over `samples` samples of this
  // process (0: this process had no data in this step and its gradients are zero), into one update.
  virtual void apply_gradients(nn::Sequential& model, optim::Optimizer& optimizer, std::int64_t samples) = 0;
  // The order in which the cluster visits every epoch of a data set of `size` samples; by default the
  // seeded permutation (or the plain order), the same on every process.
  virtual std::shared_ptr<const data::Sampler> sampler(std::int64_t size, std::uint64_t seed, bool shuffle) const;
  virtual DataShare data_share() const { return {}; }
};

class Local : public Strategy {
 public:
  std::string name() const override { return "local"; }
  int replicas() const override { return 1; }
  bool is_chief() const override { return true; }
  void initialize(nn::Sequential&, optim::Optimizer&) override {}
  void apply_gradients(nn::Sequential& model, optim::Optimizer& optimizer, std::int64_t samples) override;
};

}  // namespace cohort::train
