// cohort's allreduce (recursive doubling for small vectors, the ring above, reading the peers' memory directly
// for large vectors on one host, between 1 and 64 MiB on 2 ranks where timing chose it) over the cluster's transport
// (shared memory between ranks on one host, TCP otherwise; COHORT_SHARED_MEMORY=0 for TCP only), swept
// nccl-tests style (allreduce_sweep.hpp). It takes the cluster from the environment, so it runs under
// cohort-launch; with COHORT_COMMUNICATOR=mpi under mpirun it measures cohort's MPI communicator instead:
//
//   ./build/cohort-launch --workers 4 -- ./build/benchmarks/cohort_allreduce_bench
//   COHORT_COMMUNICATOR=mpi mpirun -np 4 ./build/benchmarks/cohort_allreduce_bench
//   ... --min-bytes 4096 --max-bytes 268435456     (defaults)
//   ... --forever                                  (repeat the sweep until stopped; for failure drills)
//   ./build/benchmarks/cohort_allreduce_bench --memcpy   (one memcpy per size: the one-host ceiling)
//   ./build/benchmarks/cohort_allreduce_bench --cores    (a cache line's round trip between two cores, and
//                                                   one core's copy of what another just wrote: the
//                                                   ceiling between ranks on two cores; cross_core.hpp)
//   ... --startup                                  (time to join and make a first allreduce; descriptors)
//   COHORT_LATENCY_OPTIMAL_BELOW=N ...              (recursive doubling below N bytes, the ring above;
//                                                   0: the ring only; to find the crossover)
//   COHORT_HALVING_DOUBLING_BELOW=N ...             (on a power of two of 4 ranks or more, recursive halving
//                                                   and doubling below N bytes, the ring above)
//   COHORT_DIRECT_FROM=N ...                        (on one host, read the peers' memory from N bytes; this
//                                                   or COHORT_LATENCY_OPTIMAL_BELOW turns off the timing)
// benchmarks/allreduce_compare.sh puts it beside Open MPI and Gloo.
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#include <cohort/cohort.hpp>
#include <cohort/comm/allreduce_timings.hpp>

#include "allreduce_sweep.hpp"
#include "cross_core.hpp"

using namespace cohort;

int main(int argc, char** argv) try {
  const auto began = std::chrono::steady_clock::now();
  sweep::Options options = sweep::parse(argc, argv);
  if (options.memcpy_only) {
    sweep::memcpy_ceiling(options);
    return 0;
  }
  if (options.cores_only) return sweep::cross_core_ceiling(options);
  const std::string_view requested = std::getenv("COHORT_COMMUNICATOR") ? std::getenv("COHORT_COMMUNICATOR") : "";
  if (!requested.empty() && requested != "mpi" && requested != "ring")
    throw std::invalid_argument("COHORT_COMMUNICATOR is '" + std::string(requested) + "'; use 'ring' or 'mpi'");
  if (requested == "mpi") {
    auto mpi = comm::make_mpi_communicator();
    auto wait = [&](comm::WorkPtr work) { work->wait(mpi->timeout()); };
    float token = 0;
    if (options.startup)
      return sweep::report_startup(
          began, mpi->rank(), mpi->size(), [&](float* data, std::size_t count) { wait(mpi->allreduce(comm::Buffer::of({data, count}), comm::ReduceOp::Sum)); },
          [&] { wait(mpi->allreduce(comm::Buffer::of({&token, 1}), comm::ReduceOp::Sum)); });
    return sweep::run(
        "cohort MPI communicator", mpi->rank(), mpi->size(), options,
        [&](float* data, std::size_t count) { wait(mpi->allreduce(comm::Buffer::of({data, count}), comm::ReduceOp::Sum)); },
        [&] { wait(mpi->allreduce(comm::Buffer::of({&token, 1}), comm::ReduceOp::Sum)); });
  }
  comm::AllreduceOptions allreduce;
  if (const char* below = std::getenv("COHORT_LATENCY_OPTIMAL_BELOW")) allreduce.latency_optimal_below_bytes = std::stoull(below);
  if (const char* below = std::getenv("COHORT_HALVING_DOUBLING_BELOW")) allreduce.halving_doubling_below_bytes = std::stoull(below);
  if (const char* from = std::getenv("COHORT_DIRECT_FROM")) allreduce.direct_from_bytes = std::stoull(from);
  comm::AllreduceTimings timings;  // as the communicator holds one; a threshold set above turns it off
  allreduce.timings = &timings;
  auto cluster = cluster::Cluster::from_environment();
  comm::Transport& transport = cluster.transport();
  // Two ranks that read each other's memory spend their first calls of each size on trials.
  if (transport.size() == 2 && transport.peer_memory() != nullptr) options.least_warm_up = comm::AllreduceTimings::kTrials;
  const char* title = cluster::with_environment_settings({}).transport == "shared-memory"
                          ? "cohort allreduce (shared memory on one host)"
                          : "cohort allreduce over TCP";
  try {
    if (options.startup)
      return sweep::report_startup(
          began, transport.rank(), transport.size(),
          [&](float* data, std::size_t count) { comm::allreduce(transport, {data, count}, allreduce); }, [&] { comm::barrier(transport); });
    return sweep::run(
        title, transport.rank(), transport.size(), options,
        [&](float* data, std::size_t count) { comm::allreduce(transport, {data, count}, allreduce); },
        [&] { comm::barrier(transport); });
  } catch (const std::exception& e) {
    // The peers learn why this rank ends, as under fit(), rather than taking its leaving for a clean goodbye
    // and naming it as the cause.
    transport.announce_failure(e.what());
    throw;
  }
} catch (const std::exception& e) {
  std::fprintf(stderr, "cohort_allreduce_bench: %s\n", e.what());
  return 1;
}
