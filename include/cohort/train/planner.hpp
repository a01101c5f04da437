#pragma once
// A capacity planner: what a data-parallel job's step would cost under each strategy, before it runs.
// An alpha-beta model of each collective (latency alpha per message, bandwidth beta per byte) over the job's
// link, the buckets backward fills and when it fills them (from a measured compute profile), and the bytes
// the placement plan puts on each parameter server:
//   ring allreduce of M bytes on n workers    2(n-1) alpha + 2(n-1)/n M/B
//   recursive doubling                        ceil(log2 n) (alpha + M/B)
//   hierarchical allreduce, h hosts of g      2(g-1)(alpha_h + M/B_h) within each host (to its first rank and
//                                             back) + the ring among the h first ranks
//   parameter servers, k of them (BytePS)     pushes and pulls bounded by max(g M/B, n b_max/B), b_max the
//                                             largest server's bytes (M/k when balanced), g workers per host
// Buckets and pushes overlap backward: each leaves when its last gradient is final, after the one before it.
//
//   const auto profile = train::plan::measure_compute(model, 128);
//   const auto predictions = train::plan::predict({.model = &model, .batch_size = 128, .workers = 4,
//                                                   .link = {.bandwidth = 125e6, .latency = 50e-6}}, profile);

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/comm/transport.hpp"
#include "cohort/nn/sequential.hpp"

namespace cohort::train::plan {

// A link in the alpha-beta model: bytes per second each way, seconds per message.
struct Link {
  double bandwidth = 0;
  double latency = 0;
};

// Throws InvalidArgument unless bandwidth > 0 and latency >= 0, both finite.
void check_link(const Link& link);

// Measures the link between the two processes of `transport` (one on each host), with the messages a job
// sends: the latency as half the best round trip of 8 bytes, the bandwidth as the slower direction's best
// transfer of `bytes` (less a round trip). Both processes call it; rank 0 gets the link, rank 1 nothing.
std::optional<Link> measure_link(comm::Transport& transport, std::size_t bytes = std::size_t{8} << 20, int rounds = 3);
// Bytes per second from "10Gbit", "100Mbit", "4GB/s", "500MB/s" or a number of bytes per second, and seconds
// from "50us", "1ms", "0.2s" or "0"; InvalidArgument naming the text and the spellings otherwise.
double parse_bandwidth(std::string_view text);
double parse_latency(std::string_view text);

// The alpha-beta costs, in seconds, of one collective over `workers` ranks.
double ring_allreduce_seconds(double bytes, int workers, const Link& link);
double recursive_doubling_seconds(double bytes, int workers, const Link& link);
// Hierarchical allreduce (comm::hierarchical_allreduce) over `workers` ranks, `per_host` on each host: each
// host's ranks send to its first rank (`host_link`), those allreduce over `link`, and broadcast back.
double hierarchical_allreduce_seconds(double bytes, int workers, int per_host, const Link& link, const Link& host_link);

// When a variable's gradient is final, in seconds after backward starts.
struct GradientReady {
  std::string variable;
  std::int64_t bytes = 0;
  double seconds = 0;
};

// One process's training step on this machine: forward, backward (with each gradient's ready time, in
// the order backward makes them final) and the optimizer's update of every variable.
struct ComputeProfile {
  std::int64_t batch_size = 0;
  int threads = 1;
  double forward_seconds = 0, backward_seconds = 0, update_seconds = 0;
  std::vector<GradientReady> ready;
};

// Times `steps` training steps of `model` at `batch_size` (after two warm-up steps) and keeps the medians.
ComputeProfile measure_compute(nn::Sequential& model, std::int64_t batch_size, int steps = 5);
// A profile as JSON, and back (InvalidArgument naming what is missing or malformed).
std::string profile_json(const ComputeProfile& profile);
ComputeProfile parse_profile(const std::string& json);

struct Job {
  const nn::Sequential* model = nullptr;
  std::int64_t batch_size = 0;  // per worker
  int workers = 1;
  Link link;
  int optimizer_slots = 2;  // Adam's; a server holds them beside each variable
  int max_servers = 0;      // parameter-server setups to try: 1..max_servers (0: up to the workers)
  std::size_t first_bucket_bytes = std::size_t{1} << 20, bucket_bytes = std::size_t{4} << 20;  // RingAllreduce's
  // > 0: every worker runs on one machine of this many cores (as on loopback), so that workers whose threads
  // outnumber the cores compute that much slower; 0: each worker has a machine of its own.
  int shared_cores = 0;
  // Workers per host: they share the host's `link` to the others and talk among themselves over
  // `host_link` (shared memory, NVLink); the parameter servers have hosts of their own.
  int workers_per_host = 1;
  Link host_link{.bandwidth = 10e9, .latency = 5e-6};
};

// Throws InvalidArgument naming the field unless the job can run: a model, batch and workers >= 1, a link.
void check_job(const Job& job);

struct ServerLoad {
  std::int64_t bytes = 0;          // the variables it holds
  double bytes_per_step = 0;       // received and sent, all workers together
  double busy_seconds = 0;         // its link's time per step
};

struct Prediction {
  std::string strategy;            // "ring allreduce", "parameter servers (2, size-balanced)", ...
  double step_seconds = 0, compute_seconds = 0, communication_seconds = 0, exposed_seconds = 0;
  double images_per_second = 0;    // all workers together
  std::vector<ServerLoad> servers; // parameter servers only
  std::string basis;               // the numbers behind it, in a line
};

// Every strategy's prediction, fastest first.
std::vector<Prediction> predict(const Job& job, const ComputeProfile& profile);

// A table of the predictions and the recommendation; and the same as JSON.
std::string report(const Job& job, const ComputeProfile& profile, const std::vector<Prediction>& predictions);
std::string report_json(const Job& job, const ComputeProfile& profile, const std::vector<Prediction>& predictions);

}  // namespace cohort::train::plan
