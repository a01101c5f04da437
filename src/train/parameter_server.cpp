#include "cohort/train/parameter_server.hpp"

#include "cohort/core/check.hpp"
#include "cohort/core/format.hpp"
#include "cohort/core/logging.hpp"
#include "cohort/ps/server.hpp"
#include "cohort/ps/verify_plan.hpp"
#include "cohort/train/variable_infos.hpp"
#include "train/parameter_server_state.hpp"
#include "train/parameter_server_workers.hpp"

namespace cohort::train {
namespace {

comm::Transport& transport_with_servers(cluster::Cluster& cluster) {
  COHORT_CHECK(!cluster.spec().ps.empty(),
               "parameter-server training needs ps tasks in the cluster ({} has none; TF_CONFIG cluster.ps, "
               "or cohort-launch --ps N)",
               cluster.spec().source);
  return cluster.transport();
}

}  // namespace

ParameterServer::ParameterServer(comm::Transport& transport, int workers, ParameterServerOptions options)
    : Strategy(options.data), transport_(transport), workers_(workers), options_(std::move(options)) {
  // The synchronizer checks the worker count; the rest is checked here. By every process, before any
  // connects: a setting only the servers refused would look, to the workers, like servers that vanished.
  synchronizer_ = std::make_unique<ParameterStoreSynchronizer>(
      transport_, workers_,
      ParameterStoreOptions{.consistency = options_.consistency, .wait_timeout = options_.wait_timeout, .gradient_dtype = options_.gradient_dtype});
  if (const auto* sync = std::get_if<ps::Sync>(&options_.consistency))
    COHORT_CHECK(sync->backup_workers >= 0 && sync->backup_workers < workers_,
                 "{} backup workers among {} workers: at least one gradient must count", sync->backup_workers, workers_);
  workers_group_ = std::make_unique<ParameterServerWorkers>(transport_, workers_, *synchronizer_);
  state_ = std::make_unique<ParameterServerState>(*workers_group_, *synchronizer_);
}

ParameterServer::ParameterServer(cluster::Cluster& cluster, ParameterServerOptions options)
    : ParameterServer(transport_with_servers(cluster), cluster.spec().replicas(), std::move(options)) {}

ParameterServer::~ParameterServer() = default;

Replicas& ParameterServer::replica_group() const { return *workers_group_; }

StateStore& ParameterServer::state_store() { return *state_; }

void ParameterServer::agree_on_plan(const nn::Sequential& model, const optim::Optimizer& optimizer) {
  plan_ = ps::make_plan(variable_infos(model), transport_.size() - workers_, options_.placement,
                        {.optimizer_slots = optimizer.slots_per_variable(), .max_shard_bytes = options_.max_shard_bytes});
  ps::verify_same_plan(transport_, *plan_);
}

void ParameterServer::initialize(nn::Sequential& model, optim::Optimizer& optimizer) {
  COHORT_CHECK(!serves(), "{} is a parameter server: it runs serve(), not initialize()", process_name());
  agree_on_plan(model, optimizer);
  synchronizer_->connect(model, optimizer, *plan_, /*servers_hold_values=*/state_->resumed());
}

History ParameterServer::serve(nn::Sequential& model, optim::Optimizer& optimizer, const ServeOptions& options) {
  COHORT_CHECK(serves(), "{} trains: serve() is for the parameter servers", process_name());
  agree_on_plan(model, optimizer);
  const int index = transport_.rank() - workers_;
  std::vector<int> worker_ranks;
  for (int rank = 0; rank < workers_; ++rank) worker_ranks.push_back(rank);
  ps::Server server(transport_, *plan_, index, std::move(worker_ranks), optimizer,
                    {.consistency = options_.consistency, .checkpoint_dir = options.checkpoint_dir, .wait_timeout = options_.wait_timeout});
  if (state_->resumed()) server.restore(state_->snapshots());
  log::info("ps {}: serving {} bytes of variables to {} workers ({})", index,
            with_thousands(plan_->bytes_per_server()[static_cast<std::size_t>(index)]), workers_,
            ps::describe(options_.consistency));
  server.serve();
  log::info("ps {}: the run is over after {} updates", index, server.stats().updates);
  return workers_group_->receive_history(synchronizer_->progress_limit());
}

void ParameterServer::finish(const History& history, const optim::Optimizer& optimizer) {
  if (is_chief()) final_stats_ = store().server_stats();
  synchronizer_->disconnect(optimizer);
  workers_group_->end_run(history);
}

std::string ParameterServer::final_report() {
  const auto& traffic = store().traffic();
  const double per_step = traffic.steps > 0 ? 1000.0 * traffic.communication_seconds / static_cast<double>(traffic.steps) : 0.0;
  return fmt::format("Parameter-server traffic:\n{}chief: {:.1f} s communicating over {} steps, {:.2f} ms per step\n",
                     ps::traffic_table(final_stats_, worker_names()), traffic.communication_seconds, traffic.steps, per_step);
}

std::vector<std::string> ParameterServer::worker_names() const {
  std::vector<std::string> names;
  for (int rank = 0; rank < workers_; ++rank) names.push_back(comm::process_name_of(transport_, rank));
  return names;
}

void ParameterServer::add_epoch_logs(Logs& logs) {
  add_exposed_seconds(logs);
  // Each server's load over the epoch as it counts it: bytes in and out, and the mean time from a
  // request's arrival to its answer (a Sync server's wait for the other workers included).
  std::vector<ps::ServerStats> stats = store().server_stats();
  for (std::size_t k = 0; k < stats.size(); ++k) {
    const ps::ServerStats& now = stats[k];
    const ps::ServerStats before = k < reported_server_stats_.size() ? reported_server_stats_[k] : ps::ServerStats{};
    const auto requests = static_cast<double>(now.requests - before.requests);
    const auto latency_sum = now.mean_latency_ms * static_cast<double>(now.requests) -
                             before.mean_latency_ms * static_cast<double>(before.requests);
    logs[server_log(k, "megabytes")] =
        static_cast<double>(now.bytes_in + now.bytes_out - before.bytes_in - before.bytes_out) / 1e6;
    logs[server_log(k, "latency_ms")] = requests > 0 ? latency_sum / requests : 0.0;
  }
  reported_server_stats_ = std::move(stats);
}

const ps::Plan& ParameterServer::placement() const {
  COHORT_CHECK(plan_.has_value(), "the placement is known after initialize()");
  return *plan_;
}

}  // namespace cohort::train
