#include "cohort/train/planner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>

#include "cohort/core/check.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/parallel.hpp"
#include "cohort/nn/precision.hpp"
#include "cohort/optim/adam.hpp"
#include "cohort/ps/placement.hpp"
#include "cohort/train/gradient_buckets.hpp"
#include "cohort/train/update.hpp"
#include "cohort/train/variable_infos.hpp"

namespace cohort::train::plan {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

double median(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2), values.end());
  return values[values.size() / 2];
}

// A layer's forward with the layers it absorbs (fused passes), as Sequential runs them.
struct Group {
  std::size_t first = 0, absorbed = 0;
  std::vector<double> forward, backward;
};

// The ready time of each variable, by name; one the profile lacks is final when backward ends.
double ready_of(const ComputeProfile& profile, const std::string& variable) {
  for (const auto& ready : profile.ready)
    if (ready.variable == variable) return ready.seconds;
  return profile.backward_seconds;
}

// Transfers that leave in order, each when it is ready and the one before has gone: when the last one ends.
struct Transfer {
  double ready = 0, seconds = 0;
};
double serial_end(const std::vector<Transfer>& transfers) {
  double end = 0;
  for (const Transfer& t : transfers) end = std::max(end, t.ready) + t.seconds;
  return end;
}

enum class Allreduce { Ring, RecursiveDoubling, Hierarchical };

int hosts_of(const Job& job) { return (job.workers + job.workers_per_host - 1) / job.workers_per_host; }

Prediction allreduce_prediction(const Job& job, const ComputeProfile& profile, Allreduce algorithm) {
  const GradientBuckets buckets(job.model->trainable_variables(), job.first_bucket_bytes, job.bucket_bytes);
  std::vector<Transfer> transfers;
  double bytes_total = 0, communication = 0;
  // On one host every rank talks over the host's link; across hosts the ring's slowest hops cross them.
  const Link& link = hosts_of(job) == 1 ? job.host_link : job.link;
  for (const GradientBucket& bucket : buckets.buckets()) {
    double ready = 0;
    for (std::size_t member : bucket.members) ready = std::max(ready, ready_of(profile, buckets.variables()[member]->name));
    const double bytes = static_cast<double>(bucket.end - bucket.begin) * sizeof(float);
    const double seconds =
        algorithm == Allreduce::RecursiveDoubling ? recursive_doubling_seconds(bytes, job.workers, link)
        : algorithm == Allreduce::Hierarchical
            ? hierarchical_allreduce_seconds(bytes, job.workers, job.workers_per_host, job.link, job.host_link)
            : ring_allreduce_seconds(bytes, job.workers, link);
    transfers.push_back({ready, seconds});
    bytes_total += bytes;
    communication += seconds;
  }
  Prediction p;
  p.strategy = algorithm == Allreduce::RecursiveDoubling ? "recursive doubling"
               : algorithm == Allreduce::Hierarchical   ? "hierarchical allreduce"
                                                        : "ring allreduce";
  p.communication_seconds = communication;
  p.exposed_seconds = std::max(0.0, serial_end(transfers) - profile.backward_seconds);
  p.compute_seconds = profile.forward_seconds + profile.backward_seconds + profile.update_seconds;
  p.step_seconds = p.compute_seconds + p.exposed_seconds;
  p.basis = fmt::format("{} buckets, {:.0f} bytes of gradients, {:.3f} ms of allreduce per step of which {:.3f} ms after backward",
                        buckets.buckets().size(), bytes_total, 1e3 * communication, 1e3 * p.exposed_seconds);
  return p;
}

// Synchronous parameter servers, as ParameterServer runs them: each worker pushes a server's shards once the
// last of their gradients is final; a server updates once every worker's push is in and replies with its
// values. A server's link carries every worker's bytes; a host's link carries all of the model's for each
// of its workers.
Prediction parameter_server_prediction(const Job& job, const ComputeProfile& profile, int servers, const std::string& policy) {
  const ps::Plan plan = ps::make_plan(variable_infos(*job.model), servers, ps::parse_policy(policy),
                                      {.optimizer_slots = job.optimizer_slots});
  const double n = job.workers, bandwidth = job.link.bandwidth, alpha = job.link.latency;
  std::vector<double> bytes(static_cast<std::size_t>(servers), 0.0), first(bytes.size(), profile.backward_seconds),
      last(bytes.size(), 0.0);
  double model_bytes = 0, first_ready = profile.backward_seconds;
  for (const ps::Shard& shard : plan.shards()) {
    const auto s = static_cast<std::size_t>(shard.server);
    const double ready = shard.trainable ? ready_of(profile, shard.variable) : profile.backward_seconds;
    bytes[s] += static_cast<double>(shard.bytes);
    first[s] = std::min(first[s], ready);
    last[s] = std::max(last[s], ready);
    model_bytes += static_cast<double>(shard.bytes);
    first_ready = std::min(first_ready, ready);
  }
  Prediction p;
  p.strategy = fmt::format("parameter servers ({}, {})", servers, policy);
  // Pushes: each server's in-link takes n copies of its bytes, a host's out-link all the model's bytes per worker.
  const double host_link_seconds = std::min(job.workers_per_host, job.workers) * model_bytes / bandwidth;
  const double pushes_end_by_worker_link = first_ready + host_link_seconds;
  double end = 0, earliest_reply = std::numeric_limits<double>::max(), busiest = 0;
  for (std::size_t s = 0; s < bytes.size(); ++s) {
    if (bytes[s] == 0) continue;
    const double push_end =
        std::max({last[s] + bytes[s] / bandwidth, first[s] + n * bytes[s] / bandwidth, pushes_end_by_worker_link}) + alpha;
    const double update = profile.update_seconds * bytes[s] / model_bytes;
    const double reply_start = push_end + update;
    earliest_reply = std::min(earliest_reply, reply_start);
    end = std::max(end, reply_start + alpha + n * bytes[s] / bandwidth);
    busiest = std::max(busiest, n * bytes[s] / bandwidth);
    p.servers.push_back({.bytes = static_cast<std::int64_t>(bytes[s]), .bytes_per_step = 2 * n * bytes[s],
                         .busy_seconds = n * bytes[s] / bandwidth});
  }
  end = std::max(end, earliest_reply + alpha + host_link_seconds);  // a host's in-link takes every reply
  p.communication_seconds = 2 * std::max(host_link_seconds, busiest) + 2 * alpha;
  p.exposed_seconds = std::max(0.0, end - profile.backward_seconds);
  p.compute_seconds = profile.forward_seconds + profile.backward_seconds;  // the servers update
  p.step_seconds = p.compute_seconds + p.exposed_seconds;
  p.basis = fmt::format("{:.0f} bytes over {} server(s), the largest holds {:.0f} (imbalance {:.2f}); pushes and replies "
                        "each bounded by max(M/B, n b_max/B) = {:.3f} ms",
                        model_bytes, servers, *std::max_element(bytes.begin(), bytes.end()), plan.imbalance(),
                        1e3 * std::max(host_link_seconds, busiest));
  return p;
}

std::string describe_bandwidth(double bytes_per_second) {
  const double bits = 8 * bytes_per_second;
  if (bits >= 1e9) return fmt::format("{:.3g} Gbit/s", bits / 1e9);
  return fmt::format("{:.3g} Mbit/s", bits / 1e6);
}

}  // namespace

void check_link(const Link& link) {
  COHORT_CHECK(std::isfinite(link.bandwidth) && link.bandwidth > 0, "the link's bandwidth must be above 0 bytes/s, got {}",
               link.bandwidth);
  COHORT_CHECK(std::isfinite(link.latency) && link.latency >= 0, "the link's latency must be 0 s or more, got {}", link.latency);
}

std::optional<Link> measure_link(comm::Transport& transport, std::size_t bytes, int rounds) {
  COHORT_CHECK(transport.size() == 2, "measuring a link takes 2 processes, one on each of its ends; this cluster has {}",
               transport.size());
  COHORT_CHECK(bytes > 0 && rounds > 0, "measuring a link takes bytes and rounds above 0, got {} and {}", bytes, rounds);
  constexpr comm::Tag kProbeTag = 0x11A4B0BE00000000ull;
  const bool measuring = transport.rank() == 0;
  const int peer = 1 - transport.rank();
  const auto wait = [&](const comm::WorkPtr& work) { work->wait(transport.timeout()); };
  transport.expect_messages_up_to(bytes);
  std::array<std::byte, 8> token{};
  std::vector<std::byte> payload(bytes);
  const auto round_trip = [&] {
    if (measuring) {
      wait(transport.send(peer, kProbeTag, token));
      wait(transport.recv(peer, kProbeTag, token));
    } else {
      wait(transport.recv(peer, kProbeTag, token));
      wait(transport.send(peer, kProbeTag, token));
    }
  };
  double best_round_trip = std::numeric_limits<double>::max();
  for (int i = 0; i < 50; ++i) {
    const auto start = Clock::now();
    round_trip();
    best_round_trip = std::min(best_round_trip, seconds_since(start));
  }
  // Each direction, timed by rank 0: the payload one way and 8 bytes the other (rank 1's acknowledgement of
  // rank 0's payload, rank 0's go-ahead for rank 1's), alpha + M/B + alpha in all.
  double slower = 0;
  for (const int payload_sender : {0, 1}) {
    const bool go_ahead = payload_sender == 1;
    double best = std::numeric_limits<double>::max();
    for (int round = 0; round < rounds; ++round) {
      const auto start = Clock::now();
      if (transport.rank() == payload_sender) {
        if (go_ahead) wait(transport.recv(peer, kProbeTag, token));
        wait(transport.send(peer, kProbeTag, payload));
        if (!go_ahead) wait(transport.recv(peer, kProbeTag, token));
      } else {
        if (go_ahead) wait(transport.send(peer, kProbeTag, token));
        wait(transport.recv(peer, kProbeTag, payload));
        if (!go_ahead) wait(transport.send(peer, kProbeTag, token));
      }
      best = std::min(best, seconds_since(start));
    }
    slower = std::max(slower, std::max(best - best_round_trip, 1e-9));
  }
  // Rank 1 leaves only once rank 0 has all of its payload: a socket closed with bytes still in flight
  // may be reset before they arrive.
  if (measuring) wait(transport.send(peer, kProbeTag, token));
  else wait(transport.recv(peer, kProbeTag, token));
  if (!measuring) return std::nullopt;
  return Link{.bandwidth = static_cast<double>(bytes) / slower, .latency = best_round_trip / 2};
}

namespace {

// A number followed by one of `units` (with its factor); InvalidArgument with `what` otherwise.
double with_unit(std::string_view text, std::initializer_list<std::pair<std::string_view, double>> units, std::string_view what) {
  const std::string copy(text);
  char* end = nullptr;
  const double value = std::strtod(copy.c_str(), &end);
  const std::string_view unit(end);
  if (end != copy.c_str() && std::isfinite(value) && value >= 0)
    for (const auto& [name, factor] : units)
      if (unit == name) return value * factor;
  throw InvalidArgument(fmt::format("'{}' is not a {}", text, what));
}

}  // namespace

double parse_bandwidth(std::string_view text) {
  const double bandwidth = with_unit(text, {{"Gbit", 1e9 / 8}, {"Mbit", 1e6 / 8}, {"GB/s", 1e9}, {"MB/s", 1e6}, {"", 1}},
                                     "bandwidth (10Gbit, 100Mbit, 4GB/s, 500MB/s, or bytes per second)");
  if (bandwidth <= 0) throw InvalidArgument(fmt::format("bandwidth '{}': a link must carry more than 0 bytes per second", text));
  return bandwidth;
}

double parse_latency(std::string_view text) {
  return with_unit(text, {{"us", 1e-6}, {"ms", 1e-3}, {"s", 1}, {"", 1}}, "latency (50us, 1ms, 0.2s, or seconds)");
}

double ring_allreduce_seconds(double bytes, int workers, const Link& link) {
  if (workers <= 1) return 0;
  const double n = workers;
  return 2 * (n - 1) * link.latency + 2 * (n - 1) / n * bytes / link.bandwidth;
}

double hierarchical_allreduce_seconds(double bytes, int workers, int per_host, const Link& link, const Link& host_link) {
  if (workers <= 1) return 0;
  const int g = std::min(per_host, workers), hosts = (workers + g - 1) / g;
  return 2 * (g - 1) * (host_link.latency + bytes / host_link.bandwidth) + ring_allreduce_seconds(bytes, hosts, link);
}

double recursive_doubling_seconds(double bytes, int workers, const Link& link) {
  if (workers <= 1) return 0;
  return std::ceil(std::log2(static_cast<double>(workers))) * (link.latency + bytes / link.bandwidth);
}

ComputeProfile measure_compute(nn::Sequential& model, std::int64_t batch_size, int steps) {
  COHORT_CHECK(batch_size > 0 && steps > 0, "a compute profile needs a batch and steps above 0, got {} and {}", batch_size, steps);
  COHORT_CHECK(model.size() > 0, "a compute profile needs a model with layers");
  const DType compute = nn::compute_dtype(model.precision());
  const Tensor inputs = Tensor::full(model.input_shape().batched(batch_size), 0.5f).to(compute);
  const auto outputs = model.output_shape().batched(batch_size);
  const Tensor upstream_start = Tensor::full(outputs, 1.0f / static_cast<float>(outputs.numel())).to(compute);
  optim::Adam adam;
  std::vector<Group> groups;
  std::vector<double> updates;
  for (int step = -2; step < steps; ++step) {  // two warm-up steps
    const bool record = step >= 0;
    const nn::ForwardContext context{true, static_cast<std::uint64_t>(step + 2)};
    Tensor activation = inputs;
    const bool first_call = groups.empty();
    std::size_t g = 0;
    for (std::size_t i = 0; i < model.size(); ++g) {
      nn::Layer& layer = model.layer(i);
      const auto start = Clock::now();
      const std::size_t absorbed = layer.absorb(model.layers().subspan(i + 1, model.size() - i - 1), context);
      activation = layer.forward(activation, context);
      if (first_call) groups.push_back({i, absorbed, {}, {}});
      if (record) groups[g].forward.push_back(seconds_since(start));
      i += 1 + absorbed;
    }
    Tensor upstream = upstream_start;
    for (auto group = groups.rbegin(); group != groups.rend(); ++group) {
      const auto start = Clock::now();
      upstream = model.layer(group->first).backward(upstream, group->first > 0);
      if (record) group->backward.push_back(seconds_since(start));
    }
    const auto start = Clock::now();
    update_variables(adam, model.trainable_variables());
    if (record) updates.push_back(seconds_since(start));
  }
  ComputeProfile profile;
  profile.batch_size = batch_size;
  profile.threads = num_threads();
  profile.update_seconds = median(updates);
  for (const Group& group : groups) profile.forward_seconds += median(group.forward);
  for (auto group = groups.rbegin(); group != groups.rend(); ++group) {
    profile.backward_seconds += median(group->backward);
    for (std::size_t i = group->first; i <= group->first + group->absorbed; ++i)
      for (const auto& variable : model.layer(i).variables())
        if (variable->trainable)
          profile.ready.push_back({variable->name, variable->value.numel() * static_cast<std::int64_t>(sizeof(float)),
                                   profile.backward_seconds});
  }
  return profile;
}

std::string profile_json(const ComputeProfile& profile) {
  nlohmann::json root{{"batch_size", profile.batch_size},           {"threads", profile.threads},
                      {"forward_seconds", profile.forward_seconds}, {"backward_seconds", profile.backward_seconds},
                      {"update_seconds", profile.update_seconds},   {"ready", nlohmann::json::array()}};
  for (const auto& ready : profile.ready)
    root["ready"].push_back({{"variable", ready.variable}, {"bytes", ready.bytes}, {"seconds", ready.seconds}});
  return root.dump(2) + "\n";
}

ComputeProfile parse_profile(const std::string& json) {
  const auto root = nlohmann::json::parse(json, nullptr, false);
  COHORT_CHECK(root.is_object(), "a compute profile is a JSON object, as cohort-plan --save-profile writes it");
  const auto number = [&](const nlohmann::json& object, const char* key, const std::string& where) {
    COHORT_CHECK(object.contains(key) && object[key].is_number() && object[key].get<double>() >= 0,
                 "the compute profile's {}{} is missing or not a number of 0 or more", where, key);
    return object[key].get<double>();
  };
  ComputeProfile profile;
  profile.batch_size = static_cast<std::int64_t>(number(root, "batch_size", ""));
  profile.threads = static_cast<int>(number(root, "threads", ""));
  profile.forward_seconds = number(root, "forward_seconds", "");
  profile.backward_seconds = number(root, "backward_seconds", "");
  profile.update_seconds = number(root, "update_seconds", "");
  COHORT_CHECK(profile.batch_size > 0, "the compute profile's batch_size must be above 0");
  COHORT_CHECK(root.contains("ready") && root["ready"].is_array(), "the compute profile's ready is missing or not a list");
  for (std::size_t i = 0; i < root["ready"].size(); ++i) {
    const auto& entry = root["ready"][i];
    const std::string where = fmt::format("ready[{}].", i);
    COHORT_CHECK(entry.is_object() && entry.contains("variable") && entry["variable"].is_string(),
                 "the compute profile's {}variable is missing or not a string", where);
    profile.ready.push_back({entry["variable"].get<std::string>(), static_cast<std::int64_t>(number(entry, "bytes", where)),
                             number(entry, "seconds", where)});
  }
  return profile;
}

void check_job(const Job& job) {
  COHORT_CHECK(job.model != nullptr && job.model->size() > 0, "a plan needs a model with layers");
  COHORT_CHECK(job.batch_size >= 1, "the batch size must be at least 1, got {}", job.batch_size);
  COHORT_CHECK(job.workers >= 1, "the worker count must be at least 1, got {}", job.workers);
  COHORT_CHECK(job.shared_cores >= 0, "the shared cores must be 0 (a machine per worker) or more, got {}", job.shared_cores);
  COHORT_CHECK(job.workers_per_host >= 1, "the workers per host must be at least 1, got {}", job.workers_per_host);
  if (job.workers_per_host > 1) check_link(job.host_link);
  COHORT_CHECK(job.max_servers >= 0, "the parameter-server count to try must be 0 (up to the workers) or more, got {}",
               job.max_servers);
  check_link(job.link);
}

std::vector<Prediction> predict(const Job& job, const ComputeProfile& profile) {
  check_job(job);
  // The profile was measured at its own batch: compute scales with the batch, and with the workers sharing
  // too few cores.
  ComputeProfile scaled = profile;
  const double contention =
      job.shared_cores > 0 ? std::max(1.0, static_cast<double>(job.workers) * profile.threads / job.shared_cores) : 1.0;
  const double scale = contention * static_cast<double>(job.batch_size) / static_cast<double>(profile.batch_size);
  scaled.forward_seconds *= scale;
  scaled.backward_seconds *= scale;
  scaled.update_seconds *= contention;
  for (auto& ready : scaled.ready) ready.seconds *= scale;
  std::vector<Prediction> predictions;
  predictions.push_back(allreduce_prediction(job, scaled, Allreduce::Ring));
  if (job.workers > 2) predictions.push_back(allreduce_prediction(job, scaled, Allreduce::RecursiveDoubling));
  // What RingAllreduce runs where a host has several workers and there is more than one host.
  if (job.workers_per_host > 1 && hosts_of(job) > 1)
    predictions.push_back(allreduce_prediction(job, scaled, Allreduce::Hierarchical));
  const int max_servers = job.max_servers > 0 ? job.max_servers : job.workers;
  for (int servers = 1; servers <= max_servers; ++servers)
    for (const char* policy : {"size-balanced", "round-robin", "tensorflow-greedy"})
      predictions.push_back(parameter_server_prediction(job, scaled, servers, policy));
  const double images = static_cast<double>(job.batch_size) * job.workers;
  for (auto& p : predictions) p.images_per_second = images / p.step_seconds;
  // Fastest first; among equals, the one with fewer processes (the order above).
  std::stable_sort(predictions.begin(), predictions.end(),
                   [](const Prediction& a, const Prediction& b) { return a.step_seconds < b.step_seconds * (1 - 1e-9); });
  return predictions;
}

std::string report(const Job& job, const ComputeProfile& profile, const std::vector<Prediction>& predictions) {
  COHORT_CHECK(!predictions.empty(), "no predictions to report");
  std::string out = fmt::format(
      "{} workers{} at batch {} over a link of {} and {:.0f} us; compute measured at batch {} with {} thread(s): forward "
      "{:.2f} ms, backward {:.2f} ms, update {:.2f} ms (scaled to batch {})\n",
      job.workers,
      job.workers_per_host > 1 ? fmt::format(" ({} per host, within it {} and {:.0f} us)", job.workers_per_host,
                                             describe_bandwidth(job.host_link.bandwidth), 1e6 * job.host_link.latency)
                               : "",
      job.batch_size, describe_bandwidth(job.link.bandwidth), 1e6 * job.link.latency, profile.batch_size,
      profile.threads, 1e3 * profile.forward_seconds, 1e3 * profile.backward_seconds, 1e3 * profile.update_seconds,
      job.batch_size);
  out += fmt::format("{:<44}{:>10}{:>12}{:>12}{:>12}{:>10}  {}\n", "strategy", "step ms", "compute ms", "comm ms",
                     "exposed ms", "img/s", "per-server MB per step (in + out)");
  for (const Prediction& p : predictions) {
    std::vector<std::string> loads;
    for (const ServerLoad& s : p.servers) loads.push_back(fmt::format("{:.1f}", s.bytes_per_step / 1e6));
    out += fmt::format("{:<44}{:>10.2f}{:>12.2f}{:>12.2f}{:>12.2f}{:>10.0f}  {}\n", p.strategy, 1e3 * p.step_seconds,
                       1e3 * p.compute_seconds, 1e3 * p.communication_seconds, 1e3 * p.exposed_seconds,
                       p.images_per_second, fmt::join(loads, " "));
  }
  const Prediction& best = predictions.front();
  out += fmt::format("recommended: {} at {:.2f} ms per step, {:.0f} img/s ({})\n", best.strategy, 1e3 * best.step_seconds,
                     best.images_per_second, best.basis);
  return out;
}

std::string report_json(const Job& job, const ComputeProfile& profile, const std::vector<Prediction>& predictions) {
  COHORT_CHECK(!predictions.empty(), "no predictions to report");
  nlohmann::json root{{"workers", job.workers},
                      {"workers_per_host", job.workers_per_host},
                      {"host_link", {{"bandwidth_bytes_per_second", job.host_link.bandwidth}, {"latency_seconds", job.host_link.latency}}},
                      {"batch_size", job.batch_size},
                      {"link", {{"bandwidth_bytes_per_second", job.link.bandwidth}, {"latency_seconds", job.link.latency}}},
                      {"profile", nlohmann::json::parse(profile_json(profile))},
                      {"recommended", predictions.front().strategy},
                      {"predictions", nlohmann::json::array()}};
  for (const Prediction& p : predictions) {
    nlohmann::json servers = nlohmann::json::array();
    for (const ServerLoad& s : p.servers)
      servers.push_back({{"bytes", s.bytes}, {"bytes_per_step", s.bytes_per_step}, {"busy_seconds", s.busy_seconds}});
    root["predictions"].push_back({{"strategy", p.strategy},
                                   {"step_seconds", p.step_seconds},
                                   {"compute_seconds", p.compute_seconds},
                                   {"communication_seconds", p.communication_seconds},
                                   {"exposed_seconds", p.exposed_seconds},
                                   {"images_per_second", p.images_per_second},
                                   {"servers", servers},
                                   {"basis", p.basis}});
  }
  return root.dump(2) + "\n";
}

}  // namespace cohort::train::plan
