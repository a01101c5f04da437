// The same sweep with Gloo's ring allreduce over its TCP transport, for comparison. Ranks come from the
// cluster environment (cohort-launch sets it); they meet through a Gloo file store in the directory named
// by COHORT_GLOO_STORE.
//   COHORT_GLOO_STORE=$(mktemp -d) ./build/cohort-launch --workers 4 -- ./build/benchmarks/gloo_allreduce_bench
#include <gloo/allreduce_ring.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <cohort/cohort.hpp>
#include <cstdio>
#include <map>
#include <memory>

#include "../allreduce_sweep.hpp"

int main(int argc, char** argv) try {
  const auto options = sweep::parse(argc, argv);
  const auto cluster = cohort::cluster::Cluster::from_environment();
  const int rank = cluster.spec().rank(), size = cluster.spec().world_size();
  const char* store_dir = std::getenv("COHORT_GLOO_STORE");
  if (store_dir == nullptr) throw std::invalid_argument("set COHORT_GLOO_STORE to a directory shared by the ranks");
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  gloo::rendezvous::FileStore store(store_dir);
  context->connectFullMesh(store, device);
  // One algorithm object per buffer: Gloo binds buffers at construction.
  std::map<std::pair<float*, std::size_t>, std::unique_ptr<gloo::AllreduceRing<float>>> algorithms;
  gloo::BarrierAllToAll barrier(context);
  return sweep::run(
      "Gloo AllreduceRing over TCP", rank, size, options,
      [&](float* data, std::size_t count) {
        auto& algorithm = algorithms[{data, count}];
        if (!algorithm) algorithm = std::make_unique<gloo::AllreduceRing<float>>(context, std::vector<float*>{data}, static_cast<int>(count));
        algorithm->run();
      },
      [&] { barrier.run(); });
} catch (const std::exception& e) {
  std::fprintf(stderr, "gloo_allreduce_bench: %s\n", e.what());
  return 1;
}
