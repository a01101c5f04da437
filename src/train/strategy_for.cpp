#include "cohort/train/strategy_for.hpp"

#include <cctype>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/comm/mpi.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/check.hpp"
#include "cohort/core/logging.hpp"
#include "cohort/core/settings.hpp"
#include "cohort/train/ring_allreduce.hpp"

namespace cohort::train {
namespace {

// COHORT_COMMUNICATOR picks what carries the gradients of data-parallel training: "ring" (the default,
// over the cluster's transport) or "mpi" (Open MPI's collectives, for a job started by mpirun).
std::string requested_communicator() { return choice_setting("COHORT_COMMUNICATOR", kCommunicatorSpellings).value_or("ring"); }

}  // namespace

std::shared_ptr<Strategy> strategy_for(cluster::Cluster& cluster, const ParameterServerOptions& options) {
  if (!cluster.spec().ps.empty()) {
    COHORT_CHECK(!options.codec, "the gradient codec {} compresses the gradients of ring allreduce; parameter servers take "
                 "float32 or bfloat16 pushes (--gradient-dtype): drop --gradient-codec",
                 options.codec ? options.codec->name() : "");
    COHORT_CHECK(options.zero_stage == 0,
                 "zero{} shards the optimizer state over the workers of ring allreduce; with parameter servers each variable's "
                 "state lives on its server already: drop --shard-optimizer",
                 options.zero_stage);
    return std::make_shared<ParameterServer>(cluster, options);
  }
  if (cluster.spec().is_chief() && ps::describe(options.consistency) != ps::describe(ps::Sync{}))
    log::warning("the consistency {} is for parameter servers, and this job has none: its gradients are averaged over "
                 "every worker at every step",
                 ps::describe(options.consistency));
  const RingAllreduceOptions allreduce{.data = options.data, .gradient_dtype = options.gradient_dtype, .zero_stage = options.zero_stage, .codec = options.codec};
  const std::string communicator = requested_communicator();
  COHORT_CHECK(communicator == "ring" || options.gradient_dtype == DType::Float32,
               "COHORT_COMMUNICATOR={} carries float32 gradients only; {} gradients take the ring communicator",
               communicator, dtype_name(options.gradient_dtype));
  if (communicator == "mpi") {
    auto mpi = comm::make_mpi_communicator();
    // A job the cluster describes (cohort-launch's TF_CONFIG) but mpirun did not start: each process would
    // be an MPI world of its own and train alone.
    COHORT_CHECK(mpi->size() == cluster.spec().world_size(),
                 "COHORT_COMMUNICATOR=mpi, but MPI sees {} process(es) where the cluster ({}) has {}: start the job with "
                 "mpirun, or unset COHORT_COMMUNICATOR for the ring over the cluster's connections",
                 mpi->size(), cluster.spec().source, cluster.spec().world_size());
    if (mpi->size() == 1) return std::make_shared<Local>();  // a single process, started without mpirun
    return std::make_shared<RingAllreduce>(std::move(mpi), allreduce);
  }
  if (cluster.distributed()) {
    // Ranks spread over several hosts, some with several ranks: one rank per host talks across hosts,
    // unless COHORT_HIERARCHICAL_ALLREDUCE=0.
    const bool flat = !switch_setting("COHORT_HIERARCHICAL_ALLREDUCE").value_or(true);
    std::shared_ptr<comm::Communicator> ring =
        comm::make_ring_communicator(cluster.transport(), flat ? std::vector<int>{} : cluster.spec().host_of());
    if (ring->name() != "ring" && cluster.spec().is_chief())
      log::info("gradients: hierarchical allreduce over the hosts of the cluster (COHORT_HIERARCHICAL_ALLREDUCE=0 turns it off)");
    return std::make_shared<RingAllreduce>(std::move(ring), allreduce);
  }
  return std::make_shared<Local>();
}

}  // namespace cohort::train
