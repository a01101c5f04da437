#pragma once
// ParameterStoreSynchronizer: gradients go to the parameter servers, which update the variables, and the
// new values come back (ps/parameter_store.hpp). The worker side of ParameterServer, usable alone.
//
// - Overlap: a model on the CPU sends each server its request as soon as backward has made every gradient
//   that server holds final; a model on a device, or a loss-scaled one (whose flag needs every gradient),
//   sends them all after backward.
// - Devices: servers and the wire work on host memory; a model on a device is staged through pinned
//   copies, queued together on one copy stream and waited for once, so that their transfers overlap.
// - Loss scaling (mixed_float16): a worker unscales its gradients and, when one is not finite, flags its
//   pushes, and the servers skip that step alike (ps/server.hpp); refused with backup workers, under
//   which the servers could disagree on a skip.
// - Progress: after each step the worker reports its step count to the others, and learns how long a
//   step may take (the progress deadline its waits on other processes use).
//
// Every process builds the same plan and checks it; then the servers serve and the workers step:
//
//   const ps::Plan plan = ps::make_plan(train::variable_infos(model), /*servers=*/1, ps::placement::SizeBalanced{},
//                                       {.optimizer_slots = optimizer.slots_per_variable()});
//   ps::verify_same_plan(transport, plan);                  // every process, workers and servers
//   if (transport.rank() >= workers) {                      // a server
//     ps::Server(transport, plan, transport.rank() - workers, worker_ranks, optimizer).serve();
//   } else {
//     train::ParameterStoreSynchronizer synchronizer(transport, workers, {.consistency = ps::Sync{}});
//     synchronizer.connect(model, optimizer, plan, /*servers_hold_values=*/false);
//     for (...) {                                            // each step
//       synchronizer.begin(model, samples);                  // backward, gradients_ready() per layer
//       synchronizer.finish(model, optimizer);               // the servers' new values are in the model
//     }
//     synchronizer.disconnect(optimizer);                    // the chief's ends the run for the servers
//   }
//
// Trainer::serve() serves a train::ParameterServer's workers, which also agree through their chief; a loop
// of the caller's own pairs the synchronizer with ps::Server.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "cohort/comm/progress_deadline.hpp"
#include "cohort/comm/transport.hpp"
#include "cohort/ps/consistency.hpp"
#include "cohort/ps/parameter_store.hpp"
#include "cohort/ps/placement.hpp"
#include "cohort/tensor/copy_stream.hpp"
#include "cohort/train/gradient_synchronizer.hpp"

namespace cohort::train {

struct ParameterStoreOptions {
  ps::Consistency consistency = ps::Sync{};
  // How long a process waits for another's progress (ParameterServerOptions::wait_timeout); 0: the
  // transport's operation deadline.
  std::chrono::milliseconds wait_timeout{0};
  // What pushes carry: float32, or bfloat16 (half the bytes).
  DType gradient_dtype = DType::Float32;
};

class ParameterStoreSynchronizer final : public GradientSynchronizer {
 public:
  // Ranks [0, workers) of `transport` train, [workers, size) serve (at least one of each); `transport`
  // outlives this.
  ParameterStoreSynchronizer(comm::Transport& transport, int workers, ParameterStoreOptions options);

  // "parameter-server (sync, 2 servers)".
  std::string name() const override;
  // Maps the model's variables onto the servers of `plan` (every process's, verified alike) and reads
  // their values; the chief first writes its own, unless the servers hold values already (a resumed run).
  // In the workers only.
  void connect(nn::Sequential& model, optim::Optimizer& optimizer, const ps::Plan& plan, bool servers_hold_values);
  void begin(nn::Sequential& model, std::int64_t samples) override;
  void gradients_ready(std::span<const nn::VariablePtr> variables) override;
  void finish(nn::Sequential& model, optim::Optimizer& optimizer) override;
  // The placement table.
  std::string setup_report() const override;
  // Time inside the exchanges with the servers, waiting for the other workers included.
  double exposed_seconds() const override { return store_ ? store_->traffic().communication_seconds : 0.0; }
  GradientTraffic traffic() const override { return {}; }
  bool set_loss_scale(LossScale* scale) override;
  bool updates_elsewhere() const override { return true; }

  // Ends this worker's part: a last read where the workers did not step in lockstep (so that each holds
  // the servers' final values), then the servers are told it is finished; the chief's ends the run, and a
  // server whose workers have not all disconnected names the one that left.
  void disconnect(const optim::Optimizer& optimizer);

  // After connect(): the store, with its live traffic counters and server_stats().
  ps::ParameterStore& store();
  bool connected() const { return store_ != nullptr; }
  // This process's progress as the others see it: the steps its store has completed.
  std::uint64_t steps_taken() const { return store_ ? static_cast<std::uint64_t>(store_->traffic().steps) : 0; }
  // How long another process may go without progress while this one waits on it: the run's deadline, or
  // more when this process's own steps show they take longer.
  std::chrono::milliseconds progress_limit() const { return progress_deadline_.limit(); }
  // True once a server said the chief has ended the run.
  bool run_ended() const { return store_ && store_->run_ended(); }
  // Sync with backup workers: the workers never wait for each other.
  bool has_backup_workers() const;
  bool steps_in_lockstep() const;

 private:
  // A model variable and the host tensors the store reads and writes for it: the variable's own on the
  // CPU, pinned copies when the model is on a device.
  struct Mirror {
    nn::VariablePtr variable;
    Tensor value, gradient;
  };
  void values_to_host(bool trainable_too);
  void values_from_host();
  // Divides the loss scale out of the host gradients; the store's index of the first one not finite.
  std::optional<std::size_t> unscale_gradients();
  // After each step: reports the count to the others and learns how long a step may take.
  void step_taken();
  // A worker under backup workers takes the learning-rate factor the servers update with.
  void follow_servers_rate(optim::Optimizer& optimizer) const;

  comm::Transport& transport_;
  int workers_;
  ParameterStoreOptions options_;
  std::unique_ptr<ps::ParameterStore> store_;
  std::vector<Mirror> mirrors_;
  std::unordered_map<const nn::Variable*, std::size_t> store_index_;  // the store's index of each variable
  bool staged_ = false;   // the model is not on the CPU
  bool pushing_ = false;  // between begin() and finish()
  std::int64_t step_samples_ = 0;
  const optim::Optimizer* optimizer_ = nullptr;  // the learning-rate factor the pushes carry
  std::unique_ptr<CopyStream> staging_;
  comm::ProgressDeadline progress_deadline_;
  std::optional<comm::ProgressDeadline::Clock::time_point> last_step_;
};

}  // namespace cohort::train
