#include "cohort/train/strategy_for.hpp"

#include <cctype>
#include <cstdlib>
#include <string>

#include "cohort/comm/mpi.hpp"
#include "cohort/core/error.hpp"
#include "cohort/train/ring_allreduce.hpp"

namespace cohort::train {
namespace {

// COHORT_COMMUNICATOR picks what carries the gradients of data-parallel training: "ring" (the default,
// over the cluster's transport) or "mpi" (Open MPI's collectives, for a job started by mpirun).
std::string requested_communicator() {
  const char* name = std::getenv("COHORT_COMMUNICATOR");
  std::string lower = name == nullptr || *name == '\0' ? "ring" : name;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower;
}

}  // namespace

std::shared_ptr<Strategy> strategy_for(cluster::Cluster& cluster, const ParameterServerOptions& options) {
  if (!cluster.spec().ps.empty()) return std::make_shared<ParameterServer>(cluster, options);
  const RingAllreduceOptions allreduce{.data = options.data};
  const std::string communicator = requested_communicator();
  if (communicator == "mpi") {
    auto mpi = comm::make_mpi_communicator();
    if (mpi->size() == 1) return std::make_shared<Local>();  // a single process, started without mpirun
    return std::make_shared<RingAllreduce>(std::move(mpi), allreduce);
  }
  if (communicator != "ring")
    throw InvalidArgument(fmt::format("COHORT_COMMUNICATOR is '{}'; use 'ring' or 'mpi'", communicator));
  if (cluster.distributed()) return std::make_shared<RingAllreduce>(cluster.transport(), allreduce);
  return std::make_shared<Local>();
}

}  // namespace cohort::train
