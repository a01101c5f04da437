#pragma once
// The rendezvous that turns a rank-only environment (mpirun, Slurm, torchrun) into a ClusterSpec.
// Rank 0 listens at the chief's address (MASTER_ADDR:MASTER_PORT); every other rank connects to it
// (authenticated with the shared secret) and reports the address it will listen on; rank 0 answers
// everybody with the full list and the parameter-server count it was given (COHORT_NUM_PS). Roles follow
// the ranks: rank 0 is the chief, the last num_ps ranks are parameter servers, the rest are workers.
//
//   ClusterSpec spec = cluster::rendezvous(request, comm::load_secret(), "10.0.0.7");

#include <string>

#include "cohort/cluster/cluster.hpp"

namespace cohort::cluster {

// `own_host` is the address the other ranks can reach this process at.
ClusterSpec rendezvous(const RendezvousRequest& request, const std::string& secret, const std::string& own_host,
                       const ConnectOptions& options = {});

}  // namespace cohort::cluster
