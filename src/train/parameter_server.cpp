#include "cohort/train/parameter_server.hpp"

#include "cohort/core/check.hpp"
#include "cohort/core/format.hpp"
#include "cohort/core/logging.hpp"
#include "cohort/ps/server.hpp"
#include "cohort/ps/verify_plan.hpp"
#include "cohort/tensor/ops.hpp"
#include "cohort/train/update.hpp"
#include "cohort/train/variable_infos.hpp"
#include "core/sealed_file.hpp"
#include "train/position_codec.hpp"

namespace cohort::train {
namespace {

comm::Transport& transport_with_servers(cluster::Cluster& cluster) {
  COHORT_CHECK(!cluster.spec().ps.empty(),
               "parameter-server training needs ps tasks in the cluster ({} has none; TF_CONFIG cluster.ps, "
               "or cohort-launch --ps N)",
               cluster.spec().source);
  return cluster.transport();
}

// Workers agree on sums (metrics, callbacks' decisions) through the chief; the chief hands the run's
// history to the servers at the end.
constexpr comm::Tag kAgreementTag = 0x5053414752454500ull;  // "PSAGREE"
constexpr comm::Tag kHistoryTag = 0x5053484953540000ull;    // "PSHIST"
constexpr comm::Tag kRunEndTag = 0x5053454e44000000ull;     // "PSEND"
constexpr std::uint64_t kMaxHistoryBytes = 64ull << 20;

// Receives `out` from `peer`, or names the peer stuck: it is connected (a lost one is reported sooner) but
// makes no progress towards the agreement, nor waits on another process that does.
void receive_agreement(comm::Transport& transport, int peer, std::span<double> out, std::uint64_t own_progress,
                       std::chrono::milliseconds limit) {
  auto received = std::make_shared<std::vector<double>>(out.size());
  const auto arriving = transport.recv(peer, kAgreementTag, std::as_writable_bytes(std::span(*received)));
  if (!comm::await_peer(transport, peer, arriving, own_progress, limit, received))
    throw TimeoutError(comm::stuck_message(transport.describe(peer) + " is stuck", "it did not reach the agreement of the workers", limit));
  std::copy(received->begin(), received->end(), out.begin());
}

}  // namespace

ParameterServer::ParameterServer(comm::Transport& transport, int workers, ParameterServerOptions options)
    : transport_(transport),
      workers_(workers),
      options_(std::move(options)),
      progress_deadline_(options_.wait_timeout.count() > 0 ? options_.wait_timeout : transport_.timeout()) {
  COHORT_CHECK(workers_ >= 1 && workers_ < transport_.size(),
               "parameter-server training needs at least one worker and one server: {} workers among {} processes",
               workers_, transport_.size());
  // Checked by every process, before any connects: a setting only the servers refused would look, to the
  // workers, like servers that vanished.
  if (const auto* sync = std::get_if<ps::Sync>(&options_.consistency))
    COHORT_CHECK(sync->backup_workers >= 0 && sync->backup_workers < workers_,
                 "{} backup workers among {} workers: at least one gradient must count", sync->backup_workers, workers_);
}

ParameterServer::ParameterServer(cluster::Cluster& cluster, ParameterServerOptions options)
    : ParameterServer(transport_with_servers(cluster), cluster.spec().replicas(), std::move(options)) {}

std::string ParameterServer::name() const {
  const int servers = transport_.size() - workers_;
  return fmt::format("parameter-server ({}, {} server{})", ps::describe(options_.consistency), servers,
                     servers == 1 ? "" : "s");
}

void ParameterServer::initialize(nn::Sequential& model, optim::Optimizer& optimizer) {
  plan_ = ps::make_plan(variable_infos(model), transport_.size() - workers_, options_.placement,
                        {.optimizer_slots = optimizer.slots_per_variable(), .max_shard_bytes = options_.max_shard_bytes});
  ps::verify_same_plan(transport_, *plan_);
  if (is_server()) return;
  // Servers and the wire work on host memory: a model on a device is staged through pinned buffers.
  staged_ = model.device() != Device::CPU;
  staging_ = staged_ ? std::make_unique<CopyStream>(model.device()) : nullptr;
  std::vector<ps::LocalVariable> variables;
  mirrors_.clear();
  store_index_.clear();
  optimizer_ = &optimizer;
  for (const auto& v : model.variables()) {
    Mirror mirror{v, v->value, v->gradient};
    if (staged_) {
      mirror.value = Tensor::pinned(v->value.shape());
      if (v->trainable) mirror.gradient = Tensor::pinned(v->gradient.shape());
    }
    store_index_[v.get()] = variables.size();
    variables.push_back({v->name, mirror.value, mirror.gradient, v->trainable});
    mirrors_.push_back(std::move(mirror));
  }
  std::vector<int> server_ranks;
  for (int rank = workers_; rank < transport_.size(); ++rank) server_ranks.push_back(rank);
  store_ = std::make_unique<ps::ParameterStore>(transport_, *plan_, std::move(server_ranks), std::move(variables),
                                                options_.wait_timeout, options_.gradient_dtype);
  // A fresh run starts from the chief's variables; a resumed one from the servers' snapshots.
  values_to_host(true);
  if (is_chief() && !resumed_from_) store_->initialize_servers();
  store_->pull();
  values_from_host();
  optimizer.set_iterations(store_->optimizer_iterations());
}

bool ParameterServer::set_loss_scale(LossScale* scale) {
  if (has_backup_workers()) return false;
  loss_scale_ = scale;
  return true;
}

void ParameterServer::begin_gradients(nn::Sequential&, std::int64_t samples) {
  if (staged_ || loss_scale_ != nullptr) return;
  store_->set_learning_rate_factor(optimizer_->learning_rate_factor());
  store_->begin_push(samples);
  pushing_ = true;
}

void ParameterServer::gradients_ready(std::span<const nn::VariablePtr> variables) {
  if (!pushing_) return;
  std::vector<std::size_t> indices;
  for (const auto& v : variables) indices.push_back(store_index_.at(v.get()));
  store_->gradients_ready(indices);
}

void ParameterServer::apply_gradients(nn::Sequential&, optim::Optimizer& optimizer, std::int64_t samples) {
  if (pushing_) {
    pushing_ = false;
    store_->finish_push();
    optimizer.set_iterations(store_->optimizer_iterations());
    follow_servers_rate(optimizer);
    step_taken();
    return;
  }
  if (staged_) {
    for (const Mirror& m : mirrors_)
      if (m.variable->trainable) staging_->copy(m.variable->gradient, m.gradient);
    values_to_host(false);  // non-trainable variables travel as their change since the last read
  }
  store_->set_learning_rate_factor(optimizer.learning_rate_factor());
  const std::optional<std::size_t> not_finite = loss_scale_ != nullptr ? unscale_gradients() : std::nullopt;
  store_->push_pull(samples, not_finite);
  values_from_host();
  optimizer.set_iterations(store_->optimizer_iterations());  // the servers' optimizers decide the learning rate
  follow_servers_rate(optimizer);
  step_taken();
  if (loss_scale_ != nullptr) loss_scale_->record(!store_->skipped_because(), store_->skipped_because().value_or(""));
}

std::optional<std::size_t> ParameterServer::unscale_gradients() {
  std::vector<Tensor> gradients;
  std::vector<std::size_t> store_indices;
  for (const Mirror& m : mirrors_) {
    if (!m.variable->trainable) continue;
    gradients.push_back(m.gradient);
    store_indices.push_back(store_index_.at(m.variable.get()));
  }
  const std::optional<std::size_t> not_finite = train::unscale_gradients(gradients, *loss_scale_);
  return not_finite ? std::optional(store_indices[*not_finite]) : std::nullopt;
}

void ParameterServer::follow_servers_rate(optim::Optimizer& optimizer) const {
  // Without agreement (backup workers) the chief's rate requests reach the others only through the servers,
  // which update with it: a worker takes it from their replies, so that its logs say the rate in use.
  if (has_backup_workers() && !is_chief() && store_->servers_learning_rate_factor() > 0)
    optimizer.set_learning_rate_factor(store_->servers_learning_rate_factor());
}

void ParameterServer::step_taken() {
  transport_.report_progress(steps_taken());
  // The time from one step to the next, pauses for validation and checkpoints included: how long the
  // others' steps may legitimately take too.
  const auto now = comm::ProgressDeadline::Clock::now();
  if (last_step_) progress_deadline_.observe(now - *last_step_);
  last_step_ = now;
}

void ParameterServer::values_to_host(bool trainable_too) {
  if (!staged_) return;
  for (const Mirror& m : mirrors_)
    if (trainable_too || !m.variable->trainable) staging_->copy(m.variable->value, m.value);
  staging_->synchronize();
}

void ParameterServer::values_from_host() {
  if (!staged_) return;
  for (const Mirror& m : mirrors_) staging_->copy(m.value, m.variable->value);
  staging_->synchronize();
}

DataShare ParameterServer::data_share() const { return data_share_for(options_.data, transport_.rank(), workers_); }

History ParameterServer::serve(nn::Sequential&, optim::Optimizer& optimizer, const std::filesystem::path& checkpoint_dir) {
  const int index = transport_.rank() - workers_;
  std::vector<int> worker_ranks;
  for (int rank = 0; rank < workers_; ++rank) worker_ranks.push_back(rank);
  ps::Server server(transport_, *plan_, index, std::move(worker_ranks), optimizer,
                    {.consistency = options_.consistency, .checkpoint_dir = checkpoint_dir, .wait_timeout = options_.wait_timeout});
  if (resumed_from_) server.restore(ps::read_snapshots(resumed_dir_, *resumed_from_));
  log::info("ps {}: serving {} bytes of variables to {} workers ({})", index,
            with_thousands(plan_->bytes_per_server()[static_cast<std::size_t>(index)]), workers_,
            ps::describe(options_.consistency));
  server.serve();
  log::info("ps {}: the run is over after {} updates", index, server.stats().updates);
  return receive_history();
}

History ParameterServer::receive_history() {
  // The chief sends it as soon as every server has answered its Done: a chief that does not is stuck.
  const auto receive = [this](std::span<std::byte> out, std::shared_ptr<void> buffer) {
    const auto limit = progress_deadline_.limit();
    if (!comm::await_peer(transport_, 0, transport_.recv(0, kHistoryTag, out), 0, limit, std::move(buffer)))
      throw TimeoutError(comm::stuck_message(transport_.describe(0) + " is stuck",
                                             "it did not send the run's history to " + process_name(), limit));
  };
  auto bytes = std::make_shared<std::uint64_t>(0);
  receive(std::as_writable_bytes(std::span(bytes.get(), 1)), bytes);
  COHORT_CHECK_AS(ProtocolError, *bytes <= kMaxHistoryBytes, "{} announced a history of {} bytes", transport_.describe(0), *bytes);
  auto encoded = std::make_shared<std::string>(*bytes, '\0');
  receive(std::as_writable_bytes(std::span(*encoded)), encoded);
  return decode_position(*encoded).first.history;
}

bool ParameterServer::has_backup_workers() const {
  const auto* sync = std::get_if<ps::Sync>(&options_.consistency);
  return sync != nullptr && sync->backup_workers > 0;
}

bool ParameterServer::steps_in_lockstep() const {
  return std::holds_alternative<ps::Sync>(options_.consistency) && !has_backup_workers();
}

bool ParameterServer::sum_over_replicas(std::span<double> values) {
  if (workers_ == 1 || has_backup_workers()) return false;
  if (!is_chief()) {
    transport_.send(0, kAgreementTag, std::as_bytes(values))->wait(transport_.timeout());
    receive_agreement(transport_, 0, values, steps_taken(), progress_deadline_.limit());
    return true;
  }
  std::vector<double> theirs(values.size());
  for (int worker = 1; worker < workers_; ++worker) {
    receive_agreement(transport_, worker, theirs, steps_taken(), progress_deadline_.limit());
    for (std::size_t i = 0; i < values.size(); ++i) values[i] += theirs[i];
  }
  std::vector<comm::WorkPtr> sends;
  for (int worker = 1; worker < workers_; ++worker) sends.push_back(transport_.send(worker, kAgreementTag, std::as_bytes(values)));
  comm::wait_all(sends, transport_.timeout());
  return true;
}

void ParameterServer::save_checkpoint(const std::filesystem::path& directory, const nn::Sequential& model,
                                      const optim::Optimizer&, const TrainingPosition& position) {
  if (!is_chief()) return;
  const ps::Manifest manifest{.step = position.global_step,
                              .policy = plan_->policy(),
                              .servers = plan_->servers(),
                              .plan_fingerprint = plan_->fingerprint(),
                              .files = store_->save(position.global_step),
                              .trainer_state = encode_position(position, model.step())};
  ps::write_manifest(directory, manifest);  // the commit point: it names a complete set of snapshots
  ps::remove_old_snapshots(directory, position.global_step);
}

std::optional<TrainingPosition> ParameterServer::restore_checkpoint(const std::filesystem::path& directory,
                                                                    nn::Sequential& model, optim::Optimizer&) {
  if (!sealed_file_exists(directory / ps::kManifestName)) {
    // A complete set of snapshots without the manifest that names them: starting over would delete them at
    // the first checkpoint, so the run refuses and says how to proceed. An incomplete set is a checkpoint
    // that failed before its commit (a full disk): it holds nothing to lose, and the next one replaces it.
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(directory, error))
      if (entry.is_directory() && entry.path().filename().string().starts_with("ps-step-") &&
          ps::holds_complete_snapshots(entry.path()))
        throw DataError(fmt::format("{} holds parameter-server snapshots ({}) but no {}: refusing to start over and "
                                    "delete them; restore the manifest to resume, or remove the directory to start afresh",
                                    directory.string(), entry.path().filename().string(), ps::kManifestName));
    return std::nullopt;
  }
  resumed_from_ = ps::read_manifest(directory);
  resumed_dir_ = directory;
  auto [position, model_step] = decode_position(resumed_from_->trainer_state);
  model.set_step(model_step);
  return position;
}

std::string ParameterServer::setup_report() const {
  return fmt::format("Parameter servers: {}, placement {}\n{}", name(), plan_->policy(), plan_->table());
}

void ParameterServer::finish(const History& history) {
  if (is_chief()) final_stats_ = store_->server_stats();
  // Every worker has pushed its last gradients (the end of fit() agrees over all of them), so a last
  // read gives each the servers' final variables, also under asynchronous updates.
  if (!steps_in_lockstep()) {
    values_to_host(true);
    store_->pull();
    values_from_host();
  }
  store_->set_learning_rate_factor(optimizer_->learning_rate_factor());
  store_->finish();
  if (!is_chief()) {
    await_end_of_run();
    return;
  }
  TrainingPosition summary;
  summary.history = history;
  const std::string encoded = encode_position(summary, 0);
  const std::uint64_t bytes = encoded.size();
  std::vector<comm::WorkPtr> sends;
  for (int server = workers_; server < transport_.size(); ++server) {
    sends.push_back(transport_.send(server, kHistoryTag, std::as_bytes(std::span(&bytes, 1))));
    sends.push_back(transport_.send(server, kHistoryTag, std::as_bytes(std::span(encoded))));
  }
  const std::uint64_t steps = steps_taken();
  for (int worker = 1; worker < workers_; ++worker)
    sends.push_back(transport_.send(worker, kRunEndTag, std::as_bytes(std::span(&steps, 1))));
  comm::wait_all(sends, transport_.timeout());
}

void ParameterServer::await_end_of_run() {
  // The chief may train on for long after this worker's share is done (asynchronous updates, backup
  // workers): the wait is legitimate while it completes steps.
  auto chief_steps = std::make_shared<std::uint64_t>(0);
  const auto ended = transport_.recv(0, kRunEndTag, std::as_writable_bytes(std::span(chief_steps.get(), 1)));
  const auto limit = progress_deadline_.limit();
  if (!comm::await_peer(transport_, 0, ended, steps_taken(), limit, chief_steps))
    throw TimeoutError(comm::stuck_message(transport_.describe(0) + " is stuck",
                                           "it completed no step while " + process_name() + " waited for the end of the run", limit));
}

std::string ParameterServer::final_report() {
  const auto& traffic = store_->traffic();
  const double per_step = traffic.steps > 0 ? 1000.0 * traffic.communication_seconds / static_cast<double>(traffic.steps) : 0.0;
  return fmt::format("Parameter-server traffic:\n{}chief: {:.1f} s communicating over {} steps, {:.2f} ms per step\n",
                     ps::traffic_table(final_stats_, worker_names()), traffic.communication_seconds, traffic.steps, per_step);
}

std::string ParameterServer::process_name() const { return comm::process_name_of(transport_, transport_.rank()); }

std::vector<std::string> ParameterServer::worker_names() const {
  std::vector<std::string> names;
  for (int rank = 0; rank < workers_; ++rank) names.push_back(comm::process_name_of(transport_, rank));
  return names;
}

void ParameterServer::add_epoch_logs(Logs& logs) {
  const auto& traffic = store_->traffic();
  logs["comm_seconds"] = traffic.communication_seconds - reported_communication_seconds_;
  reported_communication_seconds_ = traffic.communication_seconds;
  // Each server's load over the epoch as it counts it: bytes in and out, and the mean time from a
  // request's arrival to its answer (a Sync server's wait for the other workers included).
  std::vector<ps::ServerStats> stats = store_->server_stats();
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

ps::ParameterStore& ParameterServer::store() {
  COHORT_CHECK(store_ != nullptr, "only a worker has a parameter store, after initialize()");
  return *store_;
}

}  // namespace cohort::train
