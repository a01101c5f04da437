#include "cohort/train/strategy_for.hpp"

#include "cohort/train/ring_allreduce.hpp"

namespace cohort::train {

std::shared_ptr<Strategy> strategy_for(cluster::Cluster& cluster, const ParameterServerOptions& options) {
  if (!cluster.spec().ps.empty()) return std::make_shared<ParameterServer>(cluster, options);
  if (cluster.distributed()) return std::make_shared<RingAllreduce>(cluster.transport(), RingAllreduceOptions{.data = options.data});
  return std::make_shared<Local>();
}

}  // namespace cohort::train
