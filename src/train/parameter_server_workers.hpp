#pragma once
// The processes of a parameter-server job as the Trainer sees them: ranks [0, workers) train (rank 0 is
// the chief), the servers come after. Workers agree on sums (metrics, callbacks' decisions) through the
// chief, and name one stuck that makes no progress towards an agreement while its heartbeats go on.

#include <chrono>

#include "cohort/comm/transport.hpp"
#include "cohort/train/history.hpp"
#include "cohort/train/parameter_store_synchronizer.hpp"
#include "cohort/train/replicas.hpp"

namespace cohort::train {

class ParameterServerWorkers final : public Replicas {
 public:
  // Both outlive this; `synchronizer` tells this process's progress and the run's end.
  ParameterServerWorkers(comm::Transport& transport, int workers, const ParameterStoreSynchronizer& synchronizer)
      : transport_(transport), workers_(workers), synchronizer_(synchronizer) {}

  int replicas() const override { return workers_; }
  int rank() const override { return transport_.rank(); }
  std::string process_name(int rank) const override { return comm::process_name_of(transport_, rank); }
  // Among the workers, through the chief; not with backup workers, whose late pushes wait for the
  // others' next step and so could never meet them at a common point.
  bool sum_over_replicas(std::span<double> values) override;
  bool steps_in_lockstep() const override { return synchronizer_.steps_in_lockstep(); }
  bool run_ended() const override { return synchronizer_.run_ended(); }
  void announce_failure(const std::string& reason) override { transport_.announce_failure(reason); }

  // At the end of fit(): the chief sends the run's history to every server and its step count to the
  // other workers; a worker waits for the chief, while the chief completes steps.
  void end_run(const History& history);
  // On a server: the history the chief sends at the end, within `limit` of the chief's last progress.
  History receive_history(std::chrono::milliseconds limit);

 private:
  // A worker's fit() ends when the chief's does: one whose share is done waits for the chief while the
  // chief completes steps, and names it stuck when it completes none within the progress deadline, so
  // that no worker reports success for a run whose chief never finished.
  void await_end_of_run();
  // Receives `out` from `peer`, or names the peer stuck.
  void receive_agreement(int peer, std::span<double> out);

  comm::Transport& transport_;
  int workers_;
  const ParameterStoreSynchronizer& synchronizer_;
};

}  // namespace cohort::train
