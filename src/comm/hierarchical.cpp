#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <vector>

#include "cohort/comm/collectives.hpp"
#include "cohort/core/check.hpp"
#include "comm/subgroup_transport.hpp"

namespace cohort::comm {

bool spans_hosts_with_several_ranks(std::span<const int> host_of) {
  const std::set<int> hosts(host_of.begin(), host_of.end());
  return hosts.size() > 1 && hosts.size() < host_of.size();
}

void hierarchical_allreduce(Transport& transport, std::span<const int> host_of, std::span<std::byte> data,
                            const AllreduceOptions& options) {
  const int n = transport.size(), r = transport.rank();
  COHORT_CHECK(static_cast<int>(host_of.size()) == n, "hierarchical allreduce: {} hosts given for {} ranks", host_of.size(), n);
  COHORT_CHECK(options.type == DType::Float32 && data.size() % sizeof(float) == 0,
               "hierarchical allreduce: {} bytes are not whole float32 elements", data.size());
  std::vector<int> neighbours, leaders;  // this host's ranks; every host's first rank
  for (int q = 0; q < n; ++q) {
    if (host_of[static_cast<std::size_t>(q)] == host_of[static_cast<std::size_t>(r)]) neighbours.push_back(q);
    if (std::find(host_of.begin(), host_of.begin() + q, host_of[static_cast<std::size_t>(q)]) == host_of.begin() + q)
      leaders.push_back(q);
  }
  const int leader = neighbours.front();
  const std::span values(reinterpret_cast<float*>(data.data()), data.size() / sizeof(float));
  AllreduceOptions sum = options;
  sum.op = ReduceOp::Sum;
  // The caller's timings keep what the whole group agreed (collectives.cpp): the leaders alone must not
  // settle it for the others.
  sum.timings = nullptr;
  if (r != leader) {
    transport.send(leader, options.tag, data)->wait(transport.timeout());
  } else {
    thread_local std::vector<float> incoming;
    if (incoming.size() < values.size()) incoming.resize(values.size());
    for (std::size_t i = 1; i < neighbours.size(); ++i) {
      transport.recv(neighbours[i], options.tag, std::as_writable_bytes(std::span(incoming).subspan(0, values.size())))
          ->wait(transport.timeout());
      for (std::size_t k = 0; k < values.size(); ++k) values[k] += incoming[k];
    }
    SubgroupTransport across_hosts(transport, leaders);
    allreduce(across_hosts, data, sum);
  }
  SubgroupTransport within_host(transport, neighbours);
  broadcast(within_host, 0, data, options.tag);
  if (options.op == ReduceOp::Mean) {
    const float inverse = 1.0f / static_cast<float>(n);
    for (float& v : values) v *= inverse;
  }
}

}  // namespace cohort::comm
