#include "cohort/ps/placement.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <nlohmann/json.hpp>

#include "cohort/core/check.hpp"
#include "cohort/core/format.hpp"
#include "cohort/core/seed.hpp"

namespace cohort::ps {
namespace {

int least_loaded(const std::vector<std::int64_t>& loads) {
  return static_cast<int>(std::min_element(loads.begin(), loads.end()) - loads.begin());  // first on ties
}

}  // namespace

std::string Shard::name() const {
  return count == 1 ? variable : fmt::format("{}/part_{}_of_{}", variable, index, count);
}

namespace placement {

std::vector<int> RoundRobin::assign(const std::vector<Shard>& shards, int servers) const {
  std::vector<int> out;
  for (std::size_t i = 0; i < shards.size(); ++i) out.push_back(static_cast<int>(i % static_cast<std::size_t>(servers)));
  return out;
}

std::vector<int> SizeBalanced::assign(const std::vector<Shard>& shards, int servers) const {
  std::vector<std::size_t> order(shards.size());
  std::iota(order.begin(), order.end(), 0);
  // Largest first; equal loads keep creation order, so every process gets the same plan.
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return shards[a].load > shards[b].load; });
  std::vector<std::int64_t> loads(static_cast<std::size_t>(servers), 0);
  std::vector<int> out(shards.size());
  for (std::size_t i : order) {
    const int server = least_loaded(loads);
    out[i] = server;
    loads[static_cast<std::size_t>(server)] += shards[i].load;
  }
  return out;
}

std::vector<int> TensorFlowGreedy::assign(const std::vector<Shard>& shards, int servers) const {
  std::vector<std::int64_t> loads(static_cast<std::size_t>(servers), 0);
  std::vector<int> out;
  for (const Shard& shard : shards) {
    const int server = least_loaded(loads);
    out.push_back(server);
    loads[static_cast<std::size_t>(server)] += shard.bytes;
  }
  return out;
}

}  // namespace placement

std::int64_t rows_of(const Shape& shape) { return shape.rank() > 0 ? shape[0] : 1; }

std::int64_t row_elements(const Shape& shape) {
  const std::int64_t rows = rows_of(shape);
  return rows > 0 ? shape.numel() / rows : 0;
}

std::vector<Shard> make_shards(const std::vector<VariableInfo>& variables, const PlanOptions& options) {
  COHORT_CHECK(options.optimizer_slots >= 0 && options.max_shard_bytes >= 0, "placement options must not be negative");
  std::vector<const VariableInfo*> ordered;
  for (const auto& v : variables) ordered.push_back(&v);
  std::stable_sort(ordered.begin(), ordered.end(), [](const VariableInfo* a, const VariableInfo* b) {
    return a->creation_order < b->creation_order;
  });
  std::vector<Shard> shards;
  for (const VariableInfo* v : ordered) {
    const std::int64_t bytes = v->bytes();
    const std::int64_t rows = rows_of(v->shape);
    int count = 1;
    if (options.max_shard_bytes > 0 && bytes > options.max_shard_bytes && v->shape.rank() > 0)
      count = static_cast<int>(std::min<std::int64_t>(rows, (bytes + options.max_shard_bytes - 1) / options.max_shard_bytes));
    const std::int64_t base = rows / count, extra = rows % count;
    std::int64_t begin = 0;
    for (int i = 0; i < count; ++i) {
      Shard shard;
      shard.variable = v->name;
      shard.index = i;
      shard.count = count;
      shard.row_begin = begin;
      shard.row_end = begin + base + (i < extra ? 1 : 0);
      begin = shard.row_end;
      shard.shape = v->shape;
      if (v->shape.rank() > 0) shard.shape[0] = shard.row_end - shard.row_begin;
      shard.creation_order = v->creation_order;
      shard.trainable = v->trainable;
      shard.bytes = shard.shape.numel() * static_cast<std::int64_t>(sizeof(float));
      shard.load = shard.bytes * (1 + (v->trainable ? options.optimizer_slots : 0));
      shards.push_back(std::move(shard));
    }
  }
  return shards;
}

void check_server_count(int servers) { COHORT_CHECK(servers >= 1, "placement needs at least one server, got {}", servers); }

Plan finish_plan(std::string policy, int servers, std::vector<Shard> shards, const std::vector<int>& assignment) {
  check_server_count(servers);
  COHORT_CHECK(assignment.size() == shards.size(), "policy {} assigned {} of {} shards", policy, assignment.size(), shards.size());
  for (std::size_t i = 0; i < shards.size(); ++i) {
    COHORT_CHECK(assignment[i] >= 0 && assignment[i] < servers, "policy {} put {} on server {}, outside [0, {})", policy,
                 shards[i].name(), assignment[i], servers);
    shards[i].server = assignment[i];
  }
  return Plan(std::move(policy), servers, std::move(shards));
}

Plan::Plan(std::string policy, int servers, std::vector<Shard> shards)
    : policy_(std::move(policy)), servers_(servers), shards_(std::move(shards)) {}

std::vector<const Shard*> Plan::shards_of(const std::string& variable) const {
  std::vector<const Shard*> out;
  for (const auto& s : shards_)
    if (s.variable == variable) out.push_back(&s);
  return out;
}

std::vector<std::int64_t> Plan::bytes_per_server() const {
  std::vector<std::int64_t> out(static_cast<std::size_t>(servers_), 0);
  for (const auto& s : shards_) out[static_cast<std::size_t>(s.server)] += s.bytes;
  return out;
}

std::vector<std::int64_t> Plan::load_per_server() const {
  std::vector<std::int64_t> out(static_cast<std::size_t>(servers_), 0);
  for (const auto& s : shards_) out[static_cast<std::size_t>(s.server)] += s.load;
  return out;
}

double Plan::imbalance() const {
  const auto loads = load_per_server();
  const double total = static_cast<double>(std::accumulate(loads.begin(), loads.end(), std::int64_t{0}));
  if (total == 0) return 1.0;
  return static_cast<double>(*std::max_element(loads.begin(), loads.end())) / (total / servers_);
}

std::uint64_t Plan::fingerprint() const {
  std::string canonical = fmt::format("{}|{}", policy_, servers_);
  for (const auto& s : shards_) canonical += fmt::format("|{}:{}:{}:{}:{}", s.name(), s.row_begin, s.row_end, s.server, s.load);
  return derive_seed(0, canonical);
}

std::string Plan::table() const {
  std::size_t width = 8;
  for (const auto& s : shards_) width = std::max(width, s.name().size());
  std::string out = fmt::format("placement {} on {} server(s)\n{:<{}}  {:<20} {:>14}  {}\n", policy_, servers_, "variable",
                                width, "shape", "bytes", "server");
  for (const auto& s : shards_)
    out += fmt::format("{:<{}}  {:<20} {:>14}  ps {}\n", s.name(), width, s.shape.to_string(), with_thousands(s.bytes), s.server);
  const auto bytes = bytes_per_server();
  const auto loads = load_per_server();
  out += fmt::format("{:<8} {:>10} {:>16} {:>26}\n", "server", "shards", "bytes", "with optimizer state");
  for (int p = 0; p < servers_; ++p) {
    const auto count = std::count_if(shards_.begin(), shards_.end(), [&](const Shard& s) { return s.server == p; });
    out += fmt::format("ps {:<5} {:>10} {:>16} {:>26}\n", p, count, with_thousands(bytes[static_cast<std::size_t>(p)]),
                       with_thousands(loads[static_cast<std::size_t>(p)]));
  }
  out += fmt::format("imbalance (max / mean load): {:.3f}\n", imbalance());
  return out;
}

std::string Plan::json() const {
  nlohmann::json root;
  root["policy"] = policy_;
  root["servers"] = servers_;
  root["imbalance"] = imbalance();
  root["fingerprint"] = fmt::format("{:016x}", fingerprint());
  root["bytes_per_server"] = bytes_per_server();
  root["load_per_server"] = load_per_server();
  root["shards"] = nlohmann::json::array();
  for (const auto& s : shards_)
    root["shards"].push_back({{"name", s.name()}, {"variable", s.variable}, {"index", s.index}, {"count", s.count},
                              {"rows", {s.row_begin, s.row_end}}, {"shape", s.shape.dims()}, {"bytes", s.bytes},
                              {"load", s.load}, {"trainable", s.trainable}, {"server", s.server}});
  return root.dump(2);
}

AnyPolicy parse_policy(std::string_view name) {
  if (name == "round-robin") return placement::RoundRobin{};
  if (name == "size-balanced") return placement::SizeBalanced{};
  if (name == "tensorflow-greedy") return placement::TensorFlowGreedy{};
  throw InvalidArgument(fmt::format("placement policy '{}': expected round-robin, size-balanced or tensorflow-greedy", name));
}

}  // namespace cohort::ps
