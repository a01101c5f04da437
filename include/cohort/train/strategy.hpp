#pragma once
// Strategy: how a Trainer shares one training run among processes. The Trainer's loop is the same for
// every strategy; a strategy is made of parts: the replicas (who trains, which one is the chief that
// validates, logs and checkpoints, and how they agree), a gradient synchronizer (how gradients become
// updates), a state store (where checkpoints go), and which share of each epoch this process reads.
// Local is the single-process strategy; RingAllreduce and ParameterServer compose the distributed parts.
//
//   Trainer trainer(model, optim::Adam(), std::make_shared<train::Local>());

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "cohort/data/sampler.hpp"
#include "cohort/nn/replica_sum.hpp"
#include "cohort/nn/sequential.hpp"
#include "cohort/optim/optimizer.hpp"
#include "cohort/train/checkpoint.hpp"
#include "cohort/train/gradient_synchronizer.hpp"
#include "cohort/train/history.hpp"
#include "cohort/train/logs.hpp"
#include "cohort/train/loss_scale.hpp"
#include "cohort/train/replicas.hpp"
#include "cohort/train/state_store.hpp"

namespace cohort::train {

// Which share of each epoch this process reads (data::LoaderOptions::replica/replicas), and an offset
// for its data seed (non-zero when every process reads the whole set in its own order).
struct DataShare {
  int replica = 0;
  int replicas = 1;
  std::uint64_t seed_offset = 0;
};

// By default an epoch is one pass over the data set across all replicas; EachWorkerFullPass reproduces
// TensorFlow's behaviour, where every worker reads the whole set (an epoch is then replicas passes).
enum class DataPolicy { OnePassPerEpoch, EachWorkerFullPass };

// The share of each epoch replica `replica` of `replicas` reads under `policy`.
DataShare data_share_for(DataPolicy policy, int replica, int replicas);

// Where a process that serves instead of training (a parameter server) saves and resumes, and its track
// on a timeline.
struct ServeOptions {
  std::filesystem::path checkpoint_dir;  // empty: no snapshots
  bool resume = false;                   // from the snapshots in checkpoint_dir
  std::filesystem::path timeline;        // as FitOptions::timeline
};

// What such a process runs from the start of the run to its end, instead of fit(); returns the run's
// history, which the chief sends at the end.
class Service {
 public:
  virtual ~Service() = default;
  virtual History serve(nn::Sequential& model, optim::Optimizer& optimizer, const ServeOptions& options) = 0;
};

class Strategy {
 public:
  virtual ~Strategy() = default;

  virtual std::string name() const = 0;
  // The parts a strategy is made of: who trains and how the processes agree (from construction on); how
  // gradients become an update; where checkpoints go and come from (both valid before initialize(), which
  // a resume precedes).
  virtual Replicas& replica_group() const = 0;
  virtual GradientSynchronizer& synchronizer() const = 0;
  virtual StateStore& state_store() = 0;
  // Brings the model's variables to their starting values: every replica's the same (the chief's, in a
  // distributed run; fit() checks that they agree), and the parts ready (a bucketed synchronizer's
  // prepare(), which declares its buffers on every rank before any step).
  virtual void initialize(nn::Sequential& model, optim::Optimizer& optimizer) = 0;
  // A process that serves instead of training (a parameter server) runs this, and no training; null for
  // the processes that train.
  virtual Service* service() { return nullptr; }

  // Reports. Adds strategy figures to an epoch's logs (the time spent communicating); what the chief prints
  // after training (traffic); and finish(), at the end of fit() on every training process, before
  // final_report().
  virtual void add_epoch_logs(Logs& /*logs*/) {}
  virtual std::string final_report() { return {}; }
  virtual void finish(const History& /*history*/, const optim::Optimizer& /*optimizer*/) {}

  // The parts' answers, as the Trainer asks them.
  int replicas() const { return replica_group().replicas(); }
  bool is_chief() const { return replica_group().is_chief(); }
  // This process among the job's ("chief 0", "worker 1", "ps 0", "rank 2"; empty for a single process),
  // and its position, trainers first: what names and orders its track on a timeline.
  std::string process_name() const { return replica_group().process_name(process_index()); }
  int process_index() const { return replica_group().rank(); }
  // The name of the process that is replica `replica` (0 .. replicas() - 1, the chief first).
  std::string replica_name(int replica) const;
  bool sum_over_replicas(std::span<double> values) { return replica_group().sum_over_replicas(values); }
  nn::ReplicaSum* replica_sum() { return replica_group().replica_sum(); }
  bool steps_in_lockstep() const { return replica_group().steps_in_lockstep(); }
  bool should_stop() const { return replica_group().run_ended(); }
  void announce_failure(const std::string& reason) { replica_group().announce_failure(reason); }
  bool variables_on_servers() const { return synchronizer().updates_elsewhere(); }
  // Which share of each epoch this process reads, under the strategy's data policy.
  DataShare data_share() const { return data_share_for(data_policy_, process_index(), replicas()); }
  std::string setup_report() const { return synchronizer().setup_report(); }

  // One update. Before the backward pass whose gradients the next apply_gradients() takes, the Trainer
  // calls begin_gradients() with the samples they stand for (0: this process had no data in this step and
  // its gradients are zero), then gradients_ready() as each layer's gradients become final (from the last
  // layer back), so that the synchronizer may start moving them at once. apply_gradients() also works
  // without these calls (every gradient is then final).
  void begin_gradients(nn::Sequential& model, std::int64_t samples);
  void gradients_ready(std::span<const nn::VariablePtr> variables);
  void apply_gradients(nn::Sequential& model, optim::Optimizer& optimizer, std::int64_t samples);
  // Dynamic loss scaling (mixed_float16), where the synchronizer can (GradientSynchronizer::set_loss_scale).
  bool set_loss_scale(LossScale* scale) { return synchronizer().set_loss_scale(scale); }

  // Checkpoints, through the state store.
  void save_checkpoint(const std::filesystem::path& directory, const nn::Sequential& model,
                       const optim::Optimizer& optimizer, const TrainingPosition& position) {
    state_store().save(directory, model, optimizer, position);
  }
  std::optional<TrainingPosition> restore_checkpoint(const std::filesystem::path& directory, nn::Sequential& model,
                                                     optim::Optimizer& optimizer) {
    return state_store().restore(directory, model, optimizer);
  }

  // The order in which the cluster visits every epoch of a data set of `size` samples: the seeded
  // permutation (or the plain order), the same on every process.
  std::shared_ptr<const data::Sampler> sampler(std::int64_t size, std::uint64_t seed, bool shuffle) const;

 protected:
  explicit Strategy(DataPolicy data_policy = DataPolicy::OnePassPerEpoch) : data_policy_(data_policy) {}
  // comm_seconds: the time the synchronizer's exchanges waited, that backward did not hide, since the
  // last epoch.
  void add_exposed_seconds(Logs& logs);

 private:
  DataPolicy data_policy_;
  bool step_begun_ = false;
  std::int64_t step_samples_ = 0;
  double reported_exposed_seconds_ = 0;
};

class Local : public Strategy {
 public:
  std::string name() const override { return "local"; }
  Replicas& replica_group() const override { return replicas_; }
  GradientSynchronizer& synchronizer() const override { return update_; }
  StateStore& state_store() override { return state_; }
  void initialize(nn::Sequential&, optim::Optimizer&) override {}

 private:
  mutable SingleProcess replicas_;
  mutable LocalUpdate update_;
  WholeModelState state_{/*writes=*/true};
};

}  // namespace cohort::train
