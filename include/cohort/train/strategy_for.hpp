#pragma once
// The strategy a cluster calls for: Local for a single process, ParameterServer when the cluster has ps
// tasks, RingAllreduce when it has several workers and no ps. One main() then runs unchanged alone, under
// cohort-launch --workers N, or under cohort-launch --workers N --ps M. Under mpirun,
// COHORT_COMMUNICATOR=mpi makes data-parallel training reduce through Open MPI (comm/mpi.hpp).
//
//   auto cluster = cluster::Cluster::from_environment();
//   auto strategy = train::strategy_for(cluster, {.consistency = ps::parse_consistency("async")});

#include <memory>

#include "cohort/cluster/cluster.hpp"
#include "cohort/train/parameter_server.hpp"
#include "cohort/train/strategy.hpp"

namespace cohort::train {

// `options.data` applies to ring allreduce too; the rest to parameter servers only.
std::shared_ptr<Strategy> strategy_for(cluster::Cluster& cluster, const ParameterServerOptions& options = {});

}  // namespace cohort::train
