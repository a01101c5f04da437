#pragma once
// ParameterServer: parameter-server training. The same main() runs in every process: in a chief or worker
// process fit() trains, reading the variables from the servers and sending them gradients; a ps process
// serves the variables the placement plan gives it until the chief ends the run, then returns (its own
// entry point, Trainer::serve(), which fit() hands over to in such a process).
//
// The parts: the workers (ranks, agreement through the chief), a ParameterStoreSynchronizer (gradients
// to the servers, values back) and the servers' snapshots as the state store; the servers themselves run
// ps::Server.
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
//   if (strategy->serves()) trainer.serve({.checkpoint_dir = "run"});  // in a ps process
//   else trainer.fit(train_set, options);                               // (fit() would serve there too)

#include <memory>
#include <optional>
#include <vector>

#include "cohort/cluster/cluster.hpp"
#include "cohort/comm/transport.hpp"
#include "cohort/ps/consistency.hpp"
#include "cohort/ps/parameter_store.hpp"
#include "cohort/ps/placement.hpp"
#include "cohort/ps/snapshot.hpp"
#include "cohort/train/gradient_codec.hpp"
#include "cohort/train/parameter_store_synchronizer.hpp"
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

class ParameterServerWorkers;
class ParameterServerState;

class ParameterServer : public Strategy, public Service {
 public:
  // Ranks [0, workers) of `transport` train (rank 0 is the chief); ranks [workers, size) are the servers.
  ParameterServer(comm::Transport& transport, int workers, ParameterServerOptions options = {});
  // The cluster's chief and workers train, its ps tasks serve.
  explicit ParameterServer(cluster::Cluster& cluster, ParameterServerOptions options = {});
  ~ParameterServer() override;

  std::string name() const override { return synchronizer_->name(); }
  Replicas& replica_group() const override;
  GradientSynchronizer& synchronizer() const override { return *synchronizer_; }
  StateStore& state_store() override;
  // On a worker: the plan, and the store connected to the servers (from their snapshots after a resume).
  void initialize(nn::Sequential& model, optim::Optimizer& optimizer) override;
  // This process, where it is a server.
  Service* service() override { return serves() ? this : nullptr; }
  bool serves() const { return transport_.rank() >= workers_; }
  // A server serves the variables the plan gives it until the chief ends the run, then returns the run's
  // history, which the chief sends every server at the end.
  History serve(nn::Sequential& model, optim::Optimizer& optimizer, const ServeOptions& options) override;

  // comm_seconds, and each server's megabytes and latency over the epoch.
  void add_epoch_logs(Logs& logs) override;
  // Every server's traffic and latency, and the workers' staleness.
  std::string final_report() override;
  // Ends this worker's part of the run (ParameterStoreSynchronizer::disconnect); the chief sends the
  // servers the run's history, the others wait for the chief's end.
  void finish(const History& history, const optim::Optimizer& optimizer) override;

  // After initialize(): the placement plan (every process), and on workers the store with its live
  // traffic counters and server_stats().
  const ps::Plan& placement() const;
  ps::ParameterStore& store() { return synchronizer_->store(); }
  // On the chief after fit(): every server's counters as they were at the end.
  const std::vector<ps::ServerStats>& final_server_stats() const { return final_stats_; }

 private:
  // The plan every process computes from the model, checked to be the same everywhere.
  void agree_on_plan(const nn::Sequential& model, const optim::Optimizer& optimizer);
  // The workers as the cluster names them ("chief 0", "worker 0").
  std::vector<std::string> worker_names() const;

  comm::Transport& transport_;
  int workers_;
  ParameterServerOptions options_;
  std::optional<ps::Plan> plan_;
  std::unique_ptr<ParameterStoreSynchronizer> synchronizer_;
  std::unique_ptr<ParameterServerWorkers> workers_group_;
  std::unique_ptr<ParameterServerState> state_;
  std::vector<ps::ServerStats> reported_server_stats_;  // as at the last epoch's end
  std::vector<ps::ServerStats> final_stats_;
};

}  // namespace cohort::train
