#pragma once
// Discovery of the cluster from the environment a launcher or scheduler sets, in this order:
//   1. TF_CONFIG, exactly as TensorFlow and SageMaker write it ("chief" or the legacy "master";
//      "environment": "cloud" is accepted and ignored);
//   2. SageMaker's SM_HOSTS and SM_CURRENT_HOST: every host runs a worker (port COHORT_WORKER_PORT,
//      default 2222) and a parameter server (COHORT_PS_PORT, default 2223); the first host's worker is the
//      chief; COHORT_ROLE=ps selects the parameter server of this host;
//   3. rank-only environments, the first set of: Open MPI (OMPI_COMM_WORLD_RANK/SIZE), torchrun-style (RANK,
//      WORLD_SIZE) and Slurm (SLURM_PROCID/NTASKS), which name only this process's rank; the chief's address comes
//      from MASTER_ADDR and MASTER_PORT (COHORT_MASTER_ADDR/PORT take precedence), and a rendezvous at
//      that address hands out roles and the parameter-server count (COHORT_NUM_PS, read by rank 0).
// Explicit C++ configuration bypasses all of this. A malformed or contradictory setting fails here, at
// start-up, with InvalidArgument naming the variable and the field (for TF_CONFIG the JSON path).
//
//   auto found = cluster::discover();                      // the process environment
//   if (auto* spec = std::get_if<cluster::ClusterSpec>(&found)) { ... }

#include <functional>
#include <optional>
#include <string>
#include <variant>

#include "cohort/cluster/spec.hpp"

namespace cohort::cluster {

// Looks up an environment variable; std::nullopt when unset.
using Environment = std::function<std::optional<std::string>(const std::string& name)>;
Environment process_environment();

// What a rank-only environment tells: enough to meet at the chief's address and learn the rest.
struct RendezvousRequest {
  int rank = 0;
  int world_size = 1;
  Endpoint chief;
  int num_ps = 0;  // meaningful on rank 0, which decides it for everybody
  std::string source;
};

// What would describe a process a second way beside TF_CONFIG: discover() refuses TF_CONFIG with any of
// them, since which one wins must not be a guess. (Slurm's SLURM_PROCID is no description: every process
// of an allocation has it, also one given TF_CONFIG.)
inline constexpr const char* kDescriptionsBesideTfConfig[] = {"RANK", "OMPI_COMM_WORLD_RANK", "SM_HOSTS", "SM_CURRENT_HOST",
                                                              "COHORT_NUM_PS"};

// No cluster variables at all: a single local process.
struct SingleProcess {};

using Discovery = std::variant<SingleProcess, ClusterSpec, RendezvousRequest>;

Discovery discover(const Environment& environment = process_environment());

// The parsers behind discover(), for direct use and tests.
ClusterSpec parse_tf_config(const std::string& json);
ClusterSpec parse_sagemaker(const std::string& hosts_json, const std::string& current_host, const Environment& environment);

}  // namespace cohort::cluster
