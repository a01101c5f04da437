#pragma once
// Replicas: the processes that train together, this one among them, and how they agree. A strategy's
// part that the Trainer asks who is the chief, what to call each process, and to sum metrics and
// callbacks' requests over the replicas. ProcessGroup is the one over communicators (allreduce, ZeRO);
// parameter-server workers agree through their chief; a single process has nobody to agree with.
//
//   std::array<double, 2> votes{stop ? 1.0 : 0.0, 1.0};
//   if (replicas.sum_over_replicas(votes)) ...  // votes[1] == replicas.replicas() on every process

#include <span>
#include <string>

#include "cohort/nn/replica_sum.hpp"

namespace cohort::train {

class Replicas {
 public:
  virtual ~Replicas() = default;

  // The processes that compute gradients: the global batch is replicas() x the per-replica batch.
  virtual int replicas() const = 0;
  // This process among the job's, trainers first: 0 .. replicas() - 1 train, rank 0 is the chief, and a
  // parameter server's rank comes after the trainers'.
  virtual int rank() const = 0;
  bool is_chief() const { return rank() == 0; }
  // How the job names the process of `rank` ("chief 0", "worker 1", "ps 0"; empty for a lone process).
  virtual std::string process_name(int rank) const = 0;

  // Sums `values` element-wise over the processes that train; each calls it at the same point, and every
  // one ends with the same sums (added in rank order). False, leaving `values` as they are, where the
  // processes cannot wait for each other (parameter servers with backup workers) or there is only one.
  virtual bool sum_over_replicas(std::span<double> values) = 0;
  // Whether the processes step in lockstep, so that agreeing after every step costs no waiting; when not
  // (asynchronous updates, backup workers), requests are agreed at epoch boundaries only.
  virtual bool steps_in_lockstep() const { return true; }
  // True once another process has ended the run (the chief stopped early): this one stops too.
  virtual bool run_ended() const { return false; }
  // This process fails with `reason`: the others are told, so that they name the cause and not only that
  // it left.
  virtual void announce_failure(const std::string& /*reason*/) {}
  // The sum over the replicas that layers computing over every replica's batch (SyncBatchNormalization)
  // use within a pass; null where the replicas never meet (one process, parameter servers).
  virtual nn::ReplicaSum* replica_sum() { return nullptr; }
};

// One process, training alone.
class SingleProcess final : public Replicas {
 public:
  int replicas() const override { return 1; }
  int rank() const override { return 0; }
  std::string process_name(int) const override { return {}; }
  bool sum_over_replicas(std::span<double>) override { return false; }
};

}  // namespace cohort::train
