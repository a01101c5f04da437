#include "cohort/train/parameter_store_synchronizer.hpp"

#include "cohort/core/check.hpp"
#include "cohort/core/format.hpp"
#include "cohort/train/update.hpp"

namespace cohort::train {

ParameterStoreSynchronizer::ParameterStoreSynchronizer(comm::Transport& transport, int workers, ParameterStoreOptions options)
    : transport_(transport),
      workers_(workers),
      options_(std::move(options)),
      progress_deadline_(options_.wait_timeout.count() > 0 ? options_.wait_timeout : transport_.timeout()) {
  COHORT_CHECK(workers_ >= 1 && workers_ < transport_.size(),
               "parameter-server training needs at least one worker and one server: {} workers among {} processes",
               workers_, transport_.size());
}

std::string ParameterStoreSynchronizer::name() const {
  const int servers = transport_.size() - workers_;
  return fmt::format("parameter-server ({}, {} server{})", ps::describe(options_.consistency), servers,
                     servers == 1 ? "" : "s");
}

void ParameterStoreSynchronizer::connect(nn::Sequential& model, optim::Optimizer& optimizer, const ps::Plan& plan,
                                         bool servers_hold_values) {
  COHORT_CHECK(transport_.rank() < workers_, "{} is a parameter server here (ranks {} to {} serve): it runs ps::Server, "
               "and the workers the synchronizer", transport_.describe(transport_.rank()), workers_, transport_.size() - 1);
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
  store_ = std::make_unique<ps::ParameterStore>(transport_, plan, std::move(server_ranks), std::move(variables),
                                                options_.wait_timeout, options_.gradient_dtype);
  // A fresh run starts from the chief's variables; a resumed one from the servers' snapshots.
  values_to_host(true);
  if (transport_.rank() == 0 && !servers_hold_values) store_->initialize_servers();
  store_->pull();
  values_from_host();
  optimizer.set_iterations(store_->optimizer_iterations());
}

ps::ParameterStore& ParameterStoreSynchronizer::store() {
  COHORT_CHECK(store_ != nullptr, "the parameter store is connected to the servers by connect() (in ParameterServer, "
               "initialize()), in the workers only");
  return *store_;
}

bool ParameterStoreSynchronizer::set_loss_scale(LossScale* scale) {
  if (has_backup_workers()) return false;
  loss_scale_ = scale;
  return true;
}

void ParameterStoreSynchronizer::begin(nn::Sequential&, std::int64_t samples) {
  step_samples_ = samples;
  if (staged_ || loss_scale_ != nullptr) return;
  store().set_learning_rate_factor(optimizer_->learning_rate_factor());
  store_->begin_push(samples);
  pushing_ = true;
}

void ParameterStoreSynchronizer::gradients_ready(std::span<const nn::VariablePtr> variables) {
  if (!pushing_) return;
  std::vector<std::size_t> indices;
  for (const auto& v : variables) indices.push_back(store_index_.at(v.get()));
  store_->gradients_ready(indices);
}

void ParameterStoreSynchronizer::finish(nn::Sequential&, optim::Optimizer& optimizer) {
  if (pushing_) {
    pushing_ = false;
    store_->finish_push();
    optimizer.set_iterations(store_->optimizer_iterations());
    follow_servers_rate(optimizer);
    step_taken();
    return;
  }
  ps::ParameterStore& store = this->store();
  if (staged_) {
    for (const Mirror& m : mirrors_)
      if (m.variable->trainable) staging_->copy(m.variable->gradient, m.gradient);
    values_to_host(false);  // non-trainable variables travel as their change since the last read
  }
  store.set_learning_rate_factor(optimizer.learning_rate_factor());
  const std::optional<std::size_t> not_finite = loss_scale_ != nullptr ? unscale_gradients() : std::nullopt;
  store.push_pull(step_samples_, not_finite);
  values_from_host();
  optimizer.set_iterations(store.optimizer_iterations());  // the servers' optimizers decide the learning rate
  follow_servers_rate(optimizer);
  step_taken();
  if (loss_scale_ != nullptr) loss_scale_->record(!store.skipped_because(), store.skipped_because().value_or(""));
}

std::optional<std::size_t> ParameterStoreSynchronizer::unscale_gradients() {
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

void ParameterStoreSynchronizer::follow_servers_rate(optim::Optimizer& optimizer) const {
  // Without agreement (backup workers) the chief's rate requests reach the others only through the servers,
  // which update with it: a worker takes it from their replies, so that its logs say the rate in use.
  if (has_backup_workers() && transport_.rank() != 0 && store_->servers_learning_rate_factor() > 0)
    optimizer.set_learning_rate_factor(store_->servers_learning_rate_factor());
}

void ParameterStoreSynchronizer::step_taken() {
  transport_.report_progress(steps_taken());
  // The time from one step to the next, pauses for validation and checkpoints included: how long the
  // others' steps may legitimately take too.
  const auto now = comm::ProgressDeadline::Clock::now();
  if (last_step_) progress_deadline_.observe(now - *last_step_);
  last_step_ = now;
}

void ParameterStoreSynchronizer::values_to_host(bool trainable_too) {
  if (!staged_) return;
  for (const Mirror& m : mirrors_)
    if (trainable_too || !m.variable->trainable) staging_->copy(m.variable->value, m.value);
  staging_->synchronize();
}

void ParameterStoreSynchronizer::values_from_host() {
  if (!staged_) return;
  for (const Mirror& m : mirrors_) staging_->copy(m.value, m.variable->value);
  staging_->synchronize();
}

void ParameterStoreSynchronizer::disconnect(const optim::Optimizer& optimizer) {
  // Every worker has pushed its last gradients (the end of fit() agrees over all of them), so a last
  // read gives each the servers' final variables, also under asynchronous updates.
  if (!steps_in_lockstep()) {
    values_to_host(true);
    store().pull();
    values_from_host();
  }
  store().set_learning_rate_factor(optimizer.learning_rate_factor());
  store_->finish();
}

std::string ParameterStoreSynchronizer::setup_report() const {
  if (!store_) return {};
  const ps::Plan& plan = store_->placement();
  return fmt::format("Parameter servers: {}, placement {}\n{}", name(), plan.policy(), plan.table());
}

bool ParameterStoreSynchronizer::has_backup_workers() const {
  const auto* sync = std::get_if<ps::Sync>(&options_.consistency);
  return sync != nullptr && sync->backup_workers > 0;
}

bool ParameterStoreSynchronizer::steps_in_lockstep() const {
  return std::holds_alternative<ps::Sync>(options_.consistency) && !has_backup_workers();
}

}  // namespace cohort::train
