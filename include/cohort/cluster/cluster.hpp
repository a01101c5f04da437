#pragma once
// Cluster: this process's place in a run and its connection to the others. Built from explicit
// configuration or discovered from the environment (discovery.hpp); the transport connects lazily, on
// first use, with the shared secret: COHORT_SECRET or COHORT_SECRET_FILE of the environment the cluster
// is discovered from, or ConnectOptions::secret.
//
//   auto cluster = cluster::Cluster::from_environment();
//   if (cluster.distributed()) comm::allreduce(cluster.transport(), gradients, {.op = comm::ReduceOp::Mean});

#include <chrono>
#include <memory>
#include <optional>

#include "cohort/cluster/discovery.hpp"
#include "cohort/comm/group_options.hpp"
#include "cohort/comm/transport.hpp"

namespace cohort::cluster {

struct ConnectOptions {
  std::chrono::milliseconds connect_timeout{60000};
  std::chrono::milliseconds timeout{60000};
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds peer_timeout{10000};
  comm::TlsOptions tls{};
  // The transport the group connects through, by its name in comm's registry (comm/transports.hpp):
  // "shared-memory" (ranks on one host exchange messages through shared memory, TCP between hosts), "tcp"
  // (loopback TCP within a host too), or one the application registered.
  std::string transport = "shared-memory";
  // Large messages between ranks sharing memory are read straight from the sender's memory, one copy
  // (comm::GroupOptions::single_copy); false keeps them in the rings, two copies.
  bool single_copy = true;
  // The shared secret that authenticates the peers; empty: comm::load_secret() when the transport
  // connects. from_environment() reads it from the environment it is given.
  std::string secret{};
};

// `options` with what the environment sets. Deadlines: COHORT_CONNECT_TIMEOUT, COHORT_TIMEOUT (each wait
// of an operation), COHORT_HEARTBEAT_INTERVAL and COHORT_PEER_TIMEOUT, each a duration such as "90", "90s",
// "500ms" or "2m" (plain numbers are seconds). Encryption: COHORT_TLS=1 (or 0), and for certificates
// instead of the shared secret's key COHORT_TLS_CERT, COHORT_TLS_KEY and COHORT_TLS_CA (PEM files). A value
// that is not a positive duration of at most a day, a peer timeout not above the heartbeat interval, a
// COHORT_TLS other than 0 or 1 or certificates given in part throw InvalidArgument naming the variable.
// COHORT_TRANSPORT names the transport; COHORT_SHARED_MEMORY=0 (or 1) is short for COHORT_TRANSPORT=tcp
// (or shared-memory), and the two may not disagree; COHORT_SINGLE_COPY=0 (or 1) sets single_copy.
ConnectOptions with_environment_settings(ConnectOptions options, const Environment& environment = process_environment());

class Cluster {
 public:
  // A single process: rank 0 of 1, no network.
  Cluster();
  // Explicit configuration; validated here.
  explicit Cluster(ClusterSpec spec, ConnectOptions options = {});
  // The deadlines and encryption in `options` give way to what the environment sets (with_environment_settings).
  // TF_CONFIG, SageMaker, a rank-only environment (mpirun, Slurm, torchrun; meets the others in a
  // rendezvous at MASTER_ADDR:MASTER_PORT and listens at COHORT_HOST, which may be left out when the
  // chief is on loopback), or a single process when nothing is set. A distributed cluster reads its secret
  // from `environment` too, unless `options` holds one: InvalidArgument here when it has none.
  static Cluster from_environment(const Environment& environment = process_environment(), ConnectOptions options = {});

  const ClusterSpec& spec() const { return spec_; }
  bool distributed() const { return spec_.world_size() > 1; }
  // Connects on the first call (blocking until every peer is there) and returns the same transport after.
  comm::Transport& transport();

 private:
  ClusterSpec spec_;
  ConnectOptions options_;
  std::unique_ptr<comm::Transport> transport_;
};

}  // namespace cohort::cluster
