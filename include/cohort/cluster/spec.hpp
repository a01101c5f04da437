#pragma once
// ClusterSpec: who takes part in a run and as what. Roles are TensorFlow's: one optional chief, workers
// and parameter servers (ps), each with a host:port list; this process has one role and index.
// Ranks are derived in a fixed order: the chief is rank 0, then the workers, then the parameter servers.
// The chief computes gradients like a worker and also validates, logs and writes checkpoints.
//
//   ClusterSpec spec{.chief = {{"10.0.0.1", 2222}}, .workers = {{"10.0.0.2", 2222}},
//                    .ps = {{"10.0.0.3", 2223}}, .role = Role::Worker, .index = 0};
//   spec.validate();  spec.rank() == 1;  spec.describe(2) == "ps 0 (10.0.0.3:2223)"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace cohort::cluster {

enum class Role { Chief, Worker, Ps };

// "chief", "worker" or "ps".
std::string role_name(Role role);

struct Endpoint {
  std::string host;
  std::uint16_t port = 0;

  std::string to_string() const;
  friend bool operator==(const Endpoint&, const Endpoint&) = default;
};

// Parses "host:port" (or "[v6::addr]:port"); throws InvalidArgument naming `what` when malformed.
Endpoint parse_endpoint(const std::string& text, const std::string& what);

struct ClusterSpec {
  std::vector<Endpoint> chief;  // zero or one
  std::vector<Endpoint> workers;
  std::vector<Endpoint> ps;
  Role role = Role::Chief;
  int index = 0;
  std::string source = "explicit configuration";  // where the spec came from, for error messages

  // Throws InvalidArgument naming the source and the field for a contradictory or incomplete spec:
  // no chief and no worker, two chiefs, a duplicated endpoint, an index outside its role's list.
  void validate() const;

  int world_size() const;
  int rank() const { return rank_of(role, index); }
  int rank_of(Role role, int index) const;
  std::pair<Role, int> task_of(int rank) const;
  const Endpoint& endpoint(int rank) const;
  // Processes that compute gradients: the chief and the workers.
  int replicas() const { return static_cast<int>(chief.size() + workers.size()); }
  bool is_chief() const;
  // "worker 1 (10.0.0.2:2222)": how errors name a peer.
  std::string describe(int rank) const;
  // Per rank, its host: ranks whose endpoints have the same host name or address share a number
  // (numbered in rank order from 0).
  std::vector<int> host_of() const;
};

}  // namespace cohort::cluster
