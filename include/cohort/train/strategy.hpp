#pragma once
// Strategy: how a Trainer shares one training run among processes. The Trainer's loop is the same for
// every strategy; a strategy decides where variables start from, how gradients become updates, which
// share of each epoch this process reads, and which process is the chief (validation, logs, checkpoints).
// Local is the single-process strategy; distributed strategies implement the same interface.
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
#include "cohort/train/loss_scale.hpp"
#include "cohort/train/logs.hpp"

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

class Strategy {
 public:
  virtual ~Strategy() = default;

  virtual std::string name() const = 0;
  // Number of processes that compute gradients: the global batch is replicas() x per-replica batch.
  virtual int replicas() const = 0;
  virtual bool is_chief() const = 0;
  // This process among the job's ("chief 0", "worker 1", "ps 0", "rank 2"; empty for a single-process
  // strategy), and its position, trainers first: what names and orders its track on a timeline.
  virtual std::string process_name() const { return {}; }
  virtual int process_index() const { return 0; }
  // The name of the process that is replica `replica` (0 .. replicas() - 1, the chief first).
  virtual std::string replica_name(int replica) const {
    return replica == process_index() && !process_name().empty() ? process_name() : "replica " + std::to_string(replica);
  }
  // Brings the model's variables to their starting values (the chief's, in a distributed run).
  virtual void initialize(nn::Sequential& model, optim::Optimizer& optimizer) = 0;
  // Turns the gradients held by the model's trainable variables, computed over `samples` samples of this
  // process (0: this process had no data in this step and its gradients are zero), into one update.
  virtual void apply_gradients(nn::Sequential& model, optim::Optimizer& optimizer, std::int64_t samples) = 0;
  // Overlap of communication with the backward pass. Before the backward pass whose gradients the next
  // apply_gradients() takes, the Trainer calls begin_gradients() with the samples they stand for, then
  // gradients_ready() as each layer's gradients become final (from the last layer back). A strategy may
  // start moving them at once; apply_gradients() must work without these calls too (every gradient is
  // then final when it is called).
  virtual void begin_gradients(nn::Sequential& /*model*/, std::int64_t /*samples*/) {}
  virtual void gradients_ready(std::span<const nn::VariablePtr> /*variables*/) {}
  // The order in which the cluster visits every epoch of a data set of `size` samples; by default the
  // seeded permutation (or the plain order), the same on every process.
  virtual std::shared_ptr<const data::Sampler> sampler(std::int64_t size, std::uint64_t seed, bool shuffle) const;
  virtual DataShare data_share() const { return {}; }

  // Sums `values` element-wise over the processes that train; each calls it at the same point of fit(),
  // and every one ends with the same sums (added in rank order). Metrics, and what callbacks decide,
  // are agreed this way. Returns false, leaving `values` as they are, where the processes cannot wait
  // for each other (parameter servers with backup workers) or there is only one.
  virtual bool sum_over_replicas(std::span<double> /*values*/) { return false; }
  // The sum over the replicas that layers computing over every replica's batch (SyncBatchNormalization)
  // use within a pass; null where the replicas never meet (one process, parameter servers).
  virtual nn::ReplicaSum* replica_sum() { return nullptr; }
  // Whether the processes step in lockstep, so that agreeing after every step costs no waiting; when not
  // (asynchronous updates, backup workers), callbacks' requests are agreed at epoch boundaries only.
  virtual bool steps_in_lockstep() const { return true; }

  // A process that serves instead of training (a parameter server): fit() calls serve() after
  // initialize() and returns what it returns, the run's history, when the run is over.
  virtual bool is_server() const { return false; }
  // Whether the variables live on parameter servers: what a process writes into its model is not theirs.
  virtual bool variables_on_servers() const { return false; }
  virtual History serve(nn::Sequential& model, optim::Optimizer& optimizer, const std::filesystem::path& checkpoint_dir);
  // True once another process has ended the run (the chief stopped early): this one stops too.
  virtual bool should_stop() const { return false; }
  // fit() failed on this process with `reason`: tells the other processes, so that they name the cause
  // ("chief 0 (...) failed: cannot write ...: No space left on device") rather than only that it left.
  virtual void announce_failure(const std::string& /*reason*/) {}

  // Checkpoints. By default the chief writes directory/latest.ckpt and every process reads it.
  virtual void save_checkpoint(const std::filesystem::path& directory, const nn::Sequential& model,
                               const optim::Optimizer& optimizer, const TrainingPosition& position);
  virtual std::optional<TrainingPosition> restore_checkpoint(const std::filesystem::path& directory, nn::Sequential& model,
                                                             optim::Optimizer& optimizer);

  // What the chief prints before training (a placement plan) and after it (traffic); may be empty.
  virtual std::string setup_report() const { return {}; }
  virtual std::string final_report() { return {}; }
  // Called at the end of fit() on every training process with the run's history, before final_report().
  virtual void finish(const History& /*history*/) {}
  // Adds strategy figures (time spent communicating) to an epoch's logs.
  virtual void add_epoch_logs(Logs&) {}

  // Dynamic loss scaling (mixed_float16): from now on apply_gradients() divides the reduced gradients by
  // `scale` and skips a step whose gradients are not all finite, on every replica alike. False where this
  // strategy cannot: its servers update, and they do not agree on a skip.
  virtual bool set_loss_scale(LossScale* scale) {
    loss_scale_ = scale;
    return true;
  }

 protected:
  LossScale* loss_scale_ = nullptr;
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
