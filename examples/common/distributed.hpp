#pragma once
// How the examples turn their command line into a distributed setup: the strategy (train::strategy_for
// picks local, ring allreduce or parameter servers from the cluster) and the learning rate scaled with the
// number of workers, warmed up over the first epoch (Goyal et al. 2017).

#include <cohort/cohort.hpp>

#include "example_options.hpp"

namespace examples {

inline cohort::train::ParameterServerOptions distributed_options(const ExampleOptions& options) {
  using namespace cohort;
  return {.consistency = ps::parse_consistency(options.consistency),
          .placement = ps::parse_policy(options.placement),
          .max_shard_bytes = options.max_shard_bytes,
          .data = options.each_worker_full_pass ? train::DataPolicy::EachWorkerFullPass : train::DataPolicy::OnePassPerEpoch};
}

// Where this process trains: --device for workers, said in the log with the reason when "auto" falls back
// to the CPU; parameter servers keep their variables on the CPU.
inline cohort::Device training_device(const ExampleOptions& options, const cohort::train::Strategy& strategy) {
  using namespace cohort;
  if (strategy.is_server()) return Device::CPU;
  const Device device = choose_device(options.device);
  if (options.device == "auto" && device != Device::CUDA)
    log::info("device: {} (auto: {})", device_name(device), device_unavailable_reason(Device::CUDA));
  else
    log::info("device: {}", device_name(device));
  return device;
}

// Optimizer steps in one epoch: the global batch is the workers' batches together, unless every worker reads
// the whole set.
inline std::int64_t steps_per_epoch(std::int64_t samples, int replicas, const ExampleOptions& options) {
  const std::int64_t global_batch = options.batch_size * (options.each_worker_full_pass ? 1 : replicas);
  return (samples + global_batch - 1) / global_batch;
}

inline cohort::optim::Schedule scaled_for_workers(cohort::optim::Schedule base, int replicas, std::int64_t steps_per_epoch,
                                                  const ExampleOptions& options) {
  using cohort::optim::ReplicaScaling;
  const ReplicaScaling scaling = options.lr_scaling == "linear" ? ReplicaScaling::Linear
                                 : options.lr_scaling == "none" ? ReplicaScaling::None
                                                                : ReplicaScaling::Sqrt;
  return cohort::optim::scaled_for_replicas(std::move(base), replicas, scaling, replicas > 1 ? steps_per_epoch : 0);
}

}  // namespace examples
