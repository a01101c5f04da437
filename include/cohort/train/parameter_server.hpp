#pragma once
// ParameterServer: parameter-server training. The same main() runs in every process: in a chief or worker
// process fit() trains, reading the variables from the servers and sending them gradients; in a ps process
// fit() serves the variables the placement plan gives it until the chief ends the run, then returns.
//
// - Placement: every process computes the plan from the model (SizeBalanced by default, any
//   ps::PlacementPolicy) and the fingerprints are compared at start-up; the chief prints the table.
// - Consistency: ps::Sync (W workers at batch B step like one process at batch W x B), ps::Async or
//   ps::BoundedStaleness, per run (ps/consistency.hpp).
// - Start: the chief's variables initialize the servers; the other workers read them from there.
// - Data: an epoch is one pass over the data set across the workers (DataPolicy::OnePassPerEpoch), or
//   every worker reads everything (EachWorkerFullPass, TensorFlow's behaviour).
// - Checkpoints: each server writes its own snapshot, the chief writes the manifest (ps/snapshot.hpp);
//   a run resumes onto any number of servers and any placement policy.
// - At the end the chief prints each server's traffic, latency and the workers' staleness.
//
//   auto cluster = cluster::Cluster::from_environment();       // e.g. under cohort-launch --workers 2 --ps 2
//   auto strategy = std::make_shared<train::ParameterServer>(cluster, train::ParameterServerOptions{
//       .consistency = ps::Sync{}, .placement = ps::placement::SizeBalanced{}});
//   Trainer trainer(model, optim::Adam(), strategy);
//   trainer.fit(train_set, options);                              // in a ps process: serves, then returns

#include <chrono>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "cohort/cluster/cluster.hpp"
#include "cohort/comm/progress_deadline.hpp"
#include "cohort/comm/transport.hpp"
#include "cohort/ps/consistency.hpp"
#include "cohort/ps/parameter_store.hpp"
#include "cohort/ps/placement.hpp"
#include "cohort/ps/snapshot.hpp"
#include "cohort/tensor/copy_stream.hpp"
#include "cohort/train/gradient_codec.hpp"
#include "cohort/train/strategy.hpp"

namespace cohort::train {

struct ParameterServerOptions {
  ps::Consistency consistency = ps::Sync{};
  ps::AnyPolicy placement = ps::placement::SizeBalanced{};
  std::int64_t max_shard_bytes = 0;  // > 0: partition larger variables along their first axis
  DataPolicy data = DataPolicy::OnePassPerEpoch;
  // What gradients travel as: float32, or bfloat16 (half the bytes) in the pushes to the servers, which
  // widen them and add in double; and in ring allreduce, where `strategy_for` builds one
  // (RingAllreduceOptions::gradient_dtype).
  DType gradient_dtype = DType::Float32;
  // Ring allreduce only (RingAllreduceOptions::zero_stage): 1 or 2 shard the optimizer state over the ranks.
  // Parameter servers keep each variable's state on its own server already, and refuse it.
  int zero_stage = 0;
  // Ring allreduce only (RingAllreduceOptions::codec): what the gradients go through, PowerSGD or a codec of
  // the caller's; refused with parameter servers.
  std::optional<GradientCodec> codec{};
  // The progress deadline: how long a process waits for another's progress (a server for a worker's next
  // request or a Sync step's missing gradients, a worker for an answer or an agreement) before naming it
  // stuck. 0: the transport's operation deadline (COHORT_TIMEOUT, 60 s by default); it grows to 4 times the
  // longest such wait the run has shown. Lost processes are reported by the transport within its peer
  // timeout; this finds one that is alive, and sends heartbeats, but makes no progress.
  std::chrono::milliseconds wait_timeout{0};
};

class ParameterServer : public Strategy {
 public:
  // Ranks [0, workers) of `transport` train (rank 0 is the chief); ranks [workers, size) are the servers.
  ParameterServer(comm::Transport& transport, int workers, ParameterServerOptions options = {});
  // The cluster's chief and workers train, its ps tasks serve.
  explicit ParameterServer(cluster::Cluster& cluster, ParameterServerOptions options = {});

  std::string name() const override;
  int replicas() const override { return workers_; }
  bool is_chief() const override { return transport_.rank() == 0; }
  bool is_server() const override { return transport_.rank() >= workers_; }
  bool variables_on_servers() const override { return true; }
  std::string process_name() const override;
  int process_index() const override { return transport_.rank(); }
  std::string replica_name(int replica) const override { return comm::process_name_of(transport_, replica); }
  void initialize(nn::Sequential& model, optim::Optimizer& optimizer) override;
  void apply_gradients(nn::Sequential& model, optim::Optimizer& optimizer, std::int64_t samples) override;
  // Loss scaling (mixed_float16): a worker unscales its gradients and, when one is not finite, flags its
  // pushes, and the servers skip that step alike (ps/server.hpp); every worker's scale follows their answers.
  // Refused (false) with backup workers, under which the servers could disagree on a skip.
  bool set_loss_scale(LossScale* scale) override;
  // A model on the CPU sends each server its request as soon as backward has made every gradient that
  // server holds final; a model on a device, or a loss-scaled one (whose flag needs every gradient), sends
  // them all after backward.
  void begin_gradients(nn::Sequential& model, std::int64_t samples) override;
  void gradients_ready(std::span<const nn::VariablePtr> variables) override;
  DataShare data_share() const override;
  // Returns the run's history, which the chief sends every server at the end.
  History serve(nn::Sequential& model, optim::Optimizer& optimizer, const std::filesystem::path& checkpoint_dir) override;
  // Among the workers, through the chief; not with backup workers, whose late pushes wait for the
  // others' next step and so could never meet them at a common point.
  bool sum_over_replicas(std::span<double> values) override;
  bool steps_in_lockstep() const override;
  bool should_stop() const override { return store_ && store_->run_ended(); }
  void announce_failure(const std::string& reason) override { transport_.announce_failure(reason); }
  void save_checkpoint(const std::filesystem::path& directory, const nn::Sequential& model,
                       const optim::Optimizer& optimizer, const TrainingPosition& position) override;
  std::optional<TrainingPosition> restore_checkpoint(const std::filesystem::path& directory, nn::Sequential& model,
                                                     optim::Optimizer& optimizer) override;
  std::string setup_report() const override;
  std::string final_report() override;
  void finish(const History& history) override;
  void add_epoch_logs(Logs& logs) override;

  // After initialize(): the placement plan (every process), and on workers the store with its live
  // traffic counters and server_stats().
  const ps::Plan& placement() const;
  ps::ParameterStore& store();
  // On the chief after fit(): every server's counters as they were at the end.
  const std::vector<ps::ServerStats>& final_server_stats() const { return final_stats_; }

 private:
  // A model variable and the host tensors the store reads and writes for it: the variable's own on the
  // CPU, pinned copies when the model is on a device. Staging copies of all variables are queued together
  // on one copy stream and waited for once, so that their transfers overlap.
  struct Mirror {
    nn::VariablePtr variable;
    Tensor value, gradient;
  };
  void values_to_host(bool trainable_too);
  History receive_history();
  // A worker's fit() ends when the chief's does: one whose share is done waits for the chief while the
  // chief completes steps, and names it stuck when it completes none within the progress deadline, so
  // that no worker reports success for a run whose chief never finished.
  void await_end_of_run();
  // After each step: reports the count to the others and learns how long a step may take.
  void step_taken();
  // A worker under backup workers takes the learning-rate factor the servers update with.
  void follow_servers_rate(optim::Optimizer& optimizer) const;
  // This process's progress as the others see it: the steps its store has completed.
  std::uint64_t steps_taken() const { return static_cast<std::uint64_t>(store_->traffic().steps); }
  // Sync with backup workers: the workers never wait for each other.
  bool has_backup_workers() const;
  // The workers as the cluster names them ("chief 0", "worker 0").
  std::vector<std::string> worker_names() const;
  void values_from_host();
  // Divides the loss scale out of the host gradients; the store's index of the first one not finite.
  std::optional<std::size_t> unscale_gradients();

  comm::Transport& transport_;
  int workers_;
  ParameterServerOptions options_;
  std::optional<ps::Plan> plan_;
  std::unique_ptr<ps::ParameterStore> store_;
  std::vector<Mirror> mirrors_;
  std::unordered_map<const nn::Variable*, std::size_t> store_index_;  // the store's index of each variable
  bool staged_ = false;  // the model is not on the CPU
  bool pushing_ = false;  // between begin_gradients() and apply_gradients()
  const optim::Optimizer* optimizer_ = nullptr;  // the learning-rate factor the pushes carry
  std::unique_ptr<CopyStream> staging_;
  std::optional<ps::Manifest> resumed_from_;
  std::filesystem::path resumed_dir_;
  double reported_communication_seconds_ = 0;
  std::vector<ps::ServerStats> reported_server_stats_;  // as at the last epoch's end
  std::vector<ps::ServerStats> final_stats_;
  // How long another worker may go without progress (a step, or waiting on another process) while this
  // one waits on it: the run's deadline, or more when this process's own steps show they take longer.
  comm::ProgressDeadline progress_deadline_;
  std::optional<comm::ProgressDeadline::Clock::time_point> last_step_;
};

}  // namespace cohort::train
