#pragma once
// What a parameter server counts while it serves: traffic, requests and their latency (from a request's
// arrival to its answer, so a Sync server's wait for the other workers is included), and per worker the
// staleness of its gradients (updates applied by others between its read and its write) and its lead over
// the slowest worker. The chief prints them at the end of fit(); ps::ParameterStore::server_stats() fetches
// them at any time, from callbacks too.

#include <cstdint>
#include <string>
#include <vector>

namespace cohort::ps {

struct WorkerCounters {
  std::int64_t pushes = 0;
  std::int64_t dropped = 0;  // Sync with backup workers: gradients that came too late for their step
  std::int64_t staleness_sum = 0;
  std::int64_t max_staleness = 0;
  std::int64_t max_lead = 0;  // how many steps this worker was ahead of the slowest, at most

  double mean_staleness() const { return pushes > 0 ? static_cast<double>(staleness_sum) / static_cast<double>(pushes) : 0.0; }
};

struct ServerStats {
  int server = 0;
  std::int64_t bytes_in = 0;
  std::int64_t bytes_out = 0;
  std::int64_t requests = 0;
  std::int64_t refused = 0;
  std::int64_t updates = 0;  // optimizer steps applied
  double mean_latency_ms = 0;
  double p99_latency_ms = 0;
  std::vector<WorkerCounters> workers;  // by worker index (the chief is worker 0)
};

// One row per server (traffic, requests, latency, updates) and one per worker (staleness, drops).
// worker_names: how the run names each worker ("chief 0", "worker 0", ...), in worker order.
std::string traffic_table(const std::vector<ServerStats>& servers, const std::vector<std::string>& worker_names);

}  // namespace cohort::ps
