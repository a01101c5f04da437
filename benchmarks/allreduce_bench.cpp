// cohort's ring allreduce over the TCP transport, swept nccl-tests style (allreduce_sweep.hpp). It takes
// the cluster from the environment, so it runs under cohort-launch:
//
//   ./build/cohort-launch --workers 4 -- ./build/benchmarks/cohort_allreduce_bench
//   ... --min-bytes 4096 --max-bytes 268435456     (defaults)
//   ... --forever                                  (repeat the sweep until stopped; for failure drills)
// benchmarks/allreduce_compare.sh puts it beside Open MPI and Gloo.
#include <cstdio>

#include <cohort/cohort.hpp>

#include "allreduce_sweep.hpp"

using namespace cohort;

int main(int argc, char** argv) try {
  const sweep::Options options = sweep::parse(argc, argv);
  auto cluster = cluster::Cluster::from_environment();
  comm::Transport& transport = cluster.transport();
  return sweep::run(
      "cohort ring allreduce over TCP", transport.rank(), transport.size(), options,
      [&](float* data, std::size_t count) { comm::allreduce(transport, {data, count}); },
      [&] { comm::barrier(transport); });
} catch (const std::exception& e) {
  std::fprintf(stderr, "cohort_allreduce_bench: %s\n", e.what());
  return 1;
}
