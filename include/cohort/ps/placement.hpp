#pragma once
// Placement of variables on parameter servers. A policy sees every shard at once (name, shape, bytes,
// creation order, trainable) and the number of servers, and returns a deterministic assignment. Every
// process computes the plan itself; plans are compared by fingerprint at start-up.
//
// Built-in policies:
//   RoundRobin        TensorFlow's replica_device_setter: creation order, server 0 first.
//   SizeBalanced      greedy: largest load first, each to the least-loaded server, where the load counts
//                     the optimizer's slots too (Adam keeps two more copies of every trainable variable).
//   TensorFlowGreedy  TensorFlow's GreedyLoadBalancingStrategy exactly: creation order, variable bytes only,
//                     each to the least-loaded server (lowest index on ties), for comparison.
// A user policy is any type with name() and assign() (the PlacementPolicy concept).
//
//   auto plan = ps::make_plan(variables, /*servers=*/2, ps::placement::SizeBalanced{}, {.optimizer_slots = 2});
//   fmt::print("{}", plan.table());

#include <concepts>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/tensor/shape.hpp"

namespace cohort::ps {

// What placement knows about a model variable.
struct VariableInfo {
  std::string name;
  Shape shape;
  int creation_order = 0;
  bool trainable = true;
  std::int64_t bytes() const { return shape.numel() * static_cast<std::int64_t>(sizeof(float)); }
};

// A variable, or one slice of it along its first axis when it was partitioned.
struct Shard {
  std::string variable;
  int index = 0;  // shard i of `count`
  int count = 1;
  std::int64_t row_begin = 0, row_end = 0;  // along the first axis
  Shape shape;    // of this shard
  int creation_order = 0;
  bool trainable = true;
  std::int64_t bytes = 0;
  std::int64_t load = 0;  // bytes the server holds for it: the value plus optimizer slots
  int server = -1;

  // "dense/kernel" or "dense/kernel/part_1_of_3"
  std::string name() const;
};

// Variables are partitioned along their first axis: its rows (a scalar is one row), each of row_elements values.
std::int64_t rows_of(const Shape& shape);
std::int64_t row_elements(const Shape& shape);

template <typename P>
concept PlacementPolicy = requires(const P& policy, const std::vector<Shard>& shards, int servers) {
  { policy.name() } -> std::convertible_to<std::string>;
  // One server index in [0, servers) per shard, the same on every process for the same input.
  { policy.assign(shards, servers) } -> std::same_as<std::vector<int>>;
};

namespace placement {

struct RoundRobin {
  std::string name() const { return "round-robin"; }
  std::vector<int> assign(const std::vector<Shard>& shards, int servers) const;
};

struct SizeBalanced {
  std::string name() const { return "size-balanced"; }
  std::vector<int> assign(const std::vector<Shard>& shards, int servers) const;
};

struct TensorFlowGreedy {
  std::string name() const { return "tensorflow-greedy"; }
  std::vector<int> assign(const std::vector<Shard>& shards, int servers) const;
};

}  // namespace placement

// Any placement policy behind one type, for choosing one at run time (from the command line).
class AnyPolicy {
 public:
  template <PlacementPolicy P>
  AnyPolicy(P policy)  // NOLINT: implicit, so that any policy converts
      : name_(policy.name()), assign_([policy](const std::vector<Shard>& shards, int servers) { return policy.assign(shards, servers); }) {}

  std::string name() const { return name_; }
  std::vector<int> assign(const std::vector<Shard>& shards, int servers) const { return assign_(shards, servers); }

 private:
  std::string name_;
  std::function<std::vector<int>(const std::vector<Shard>&, int)> assign_;
};

// "round-robin", "size-balanced" or "tensorflow-greedy"; throws InvalidArgument naming the text otherwise.
AnyPolicy parse_policy(std::string_view name);

struct PlanOptions {
  int optimizer_slots = 0;               // slots per trainable variable (optim::Optimizer::slots_per_variable)
  std::int64_t max_shard_bytes = 0;      // > 0: split larger variables along the first axis
};

class Plan {
 public:
  Plan(std::string policy, int servers, std::vector<Shard> shards);

  const std::string& policy() const { return policy_; }
  int servers() const { return servers_; }
  const std::vector<Shard>& shards() const { return shards_; }
  std::vector<const Shard*> shards_of(const std::string& variable) const;

  std::vector<std::int64_t> bytes_per_server() const;  // variable values
  std::vector<std::int64_t> load_per_server() const;   // values plus optimizer slots
  // max / mean of the per-server load; 1.0 is perfect balance.
  double imbalance() const;
  // Same plan, same value on every process: policy, servers, and every shard's name, rows and server.
  std::uint64_t fingerprint() const;

  // A table (variable, shape, bytes, server) with per-server totals and the imbalance ratio.
  std::string table() const;
  std::string json() const;

 private:
  std::string policy_;
  int servers_;
  std::vector<Shard> shards_;
};

// Cuts variables into shards (when options.max_shard_bytes asks for it), in creation order.
std::vector<Shard> make_shards(const std::vector<VariableInfo>& variables, const PlanOptions& options);

// Throws InvalidArgument unless servers >= 1.
void check_server_count(int servers);

// Checks the result of a user policy and builds the plan; throws InvalidArgument naming the problem.
Plan finish_plan(std::string policy, int servers, std::vector<Shard> shards, const std::vector<int>& assignment);

template <PlacementPolicy Policy>
Plan make_plan(const std::vector<VariableInfo>& variables, int servers, const Policy& policy, const PlanOptions& options = {}) {
  std::vector<Shard> shards = make_shards(variables, options);
  check_server_count(servers);  // before the policy divides by it
  const std::vector<int> assignment = policy.assign(shards, servers);
  return finish_plan(policy.name(), servers, std::move(shards), assignment);
}

}  // namespace cohort::ps
