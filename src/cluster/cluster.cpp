#include "cohort/cluster/cluster.hpp"

#include <fmt/format.h>

#include "cohort/cluster/rendezvous.hpp"
#include "cohort/comm/tcp.hpp"
#include "cohort/comm/transports.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/logging.hpp"

namespace cohort::cluster {

Cluster::Cluster() {
  spec_.chief = {{"127.0.0.1", 1}};
  spec_.source = "single process";
}

Cluster::Cluster(ClusterSpec spec, ConnectOptions options) : spec_(std::move(spec)), options_(options) { spec_.validate(); }

Cluster Cluster::from_environment(const Environment& environment, ConnectOptions options) {
  options = with_environment_settings(std::move(options), environment);
  const Discovery found = discover(environment);
  const auto secret_from_environment = [&] {
    if (options.secret.empty()) options.secret = comm::load_secret(environment, "the environment Cluster::from_environment read");
  };
  if (const auto* spec = std::get_if<ClusterSpec>(&found)) {
    if (spec->world_size() > 1) secret_from_environment();
    return Cluster(*spec, options);
  }
  if (const auto* request = std::get_if<RendezvousRequest>(&found)) {
    if (request->world_size == 1) return Cluster();
    std::string own_host = environment("COHORT_HOST").value_or("");
    if (own_host.empty()) {
      const std::string& chief = request->chief.host;
      if (chief != "127.0.0.1" && chief != "localhost" && chief != "::1")
        throw InvalidArgument(fmt::format("{}: set COHORT_HOST to the address at which the other ranks can reach "
                                          "this process (the chief is at {}, not on this machine's loopback)",
                                          request->source, request->chief.to_string()));
      own_host = chief == "::1" ? "::1" : "127.0.0.1";
    }
    secret_from_environment();
    return Cluster(rendezvous(*request, options.secret, own_host, options), options);
  }
  return Cluster();
}

comm::Transport& Cluster::transport() {
  if (!transport_) {
    comm::GroupOptions group;
    group.rank = spec_.rank();
    for (int r = 0; r < spec_.world_size(); ++r) {
      group.addresses.push_back({spec_.endpoint(r).host, spec_.endpoint(r).port});
      group.names.push_back(spec_.describe(r));
    }
    group.secret = !distributed()            ? std::string("single process")
                   : !options_.secret.empty() ? options_.secret
                                              : comm::load_secret();
    group.connect_timeout = options_.connect_timeout;
    group.timeout = options_.timeout;
    group.heartbeat_interval = options_.heartbeat_interval;
    group.peer_timeout = options_.peer_timeout;
    group.tls = options_.tls;
    group.single_copy = options_.single_copy;
    transport_ = comm::connect_transport(options_.transport, group);
    if (distributed() && options_.transport == "tcp")
      log::info("{}: shared memory is off (COHORT_TRANSPORT=tcp or COHORT_SHARED_MEMORY=0): the peers on its host are "
                "reached over TCP", spec_.describe(spec_.rank()));
  }
  return *transport_;
}

}  // namespace cohort::cluster
