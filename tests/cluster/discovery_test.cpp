// Cluster discovery from every environment style, from good and from bad inputs: a bad one must fail
// at once with a message that names the variable and the field.
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cstdlib>
#include <functional>
#include <map>

#include "cohort/cluster/cluster.hpp"
#include "cohort/cluster/discovery.hpp"
#include "cohort/comm/collectives.hpp"
#include "cohort/comm/inproc.hpp"
#include "cohort/comm/transports.hpp"
#include "cohort/core/error.hpp"
#include "comm/comm_test_util.hpp"
#include "comm/shm/shm_transport.hpp"
#include "environment.hpp"

using namespace cohort;
using namespace cohort::cluster;
using cluster_test::environment_of;

namespace {

template <typename Call>
void require_invalid(Call&& call, std::initializer_list<std::string> fragments) {
  try {
    call();
    FAIL("expected InvalidArgument");
  } catch (const InvalidArgument& e) {
    const std::string message = e.what();
    INFO(message);
    for (const auto& fragment : fragments) CHECK(message.find(fragment) != std::string::npos);
  }
}

// Whether this machine's resolver maps `name` to 127.0.0.1 (a root without /etc/hosts has no "localhost").
bool resolves_to_loopback(const char* name) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* found = nullptr;
  if (::getaddrinfo(name, nullptr, &hints, &found) != 0) return false;
  bool loopback = false;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next)
    loopback = loopback || reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr.s_addr == htonl(INADDR_LOOPBACK);
  ::freeaddrinfo(found);
  return loopback;
}

}  // namespace

TEST_CASE("TF_CONFIG as TensorFlow and SageMaker write it", "[cluster]") {
  const auto spec = parse_tf_config(R"({"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222", "host2:2222"],
                                        "ps": ["host0:2223", "host1:2223"]},
                                        "task": {"type": "worker", "index": 1}, "environment": "cloud"})");
  CHECK(spec.world_size() == 5);
  CHECK(spec.replicas() == 3);
  CHECK(spec.rank() == 2);
  CHECK_FALSE(spec.is_chief());
  CHECK(spec.describe(3) == "ps 0 (host0:2223)");
  CHECK(spec.task_of(4) == std::pair<Role, int>{Role::Ps, 1});
  CHECK(spec.endpoint(0) == Endpoint{"host0", 2222});

  const auto legacy = parse_tf_config(R"({"cluster": {"master": ["m:1"], "ps": ["p:2"]}, "task": {"type": "master"}})");
  CHECK(legacy.role == Role::Chief);
  CHECK(legacy.is_chief());
  CHECK(legacy.rank() == 0);

  const auto v6 = parse_tf_config(R"({"cluster": {"worker": ["[::1]:5000", "[::1]:5001"]}, "task": {"type": "worker", "index": 0}})");
  CHECK(v6.endpoint(1) == Endpoint{"::1", 5001});
  CHECK(v6.endpoint(1).to_string() == "[::1]:5001");
  CHECK(v6.is_chief());  // without a chief, worker 0 takes its duties
}

TEST_CASE("malformed or contradictory TF_CONFIG fails naming the JSON path", "[cluster]") {
  require_invalid([] { parse_tf_config("{\"cluster\": "); }, {"TF_CONFIG", "not valid JSON"});
  require_invalid([] { parse_tf_config("[1, 2]"); }, {"TF_CONFIG", "top level"});
  require_invalid([] { parse_tf_config(R"({"task": {"type": "worker"}})"); }, {"TF_CONFIG", "'cluster'"});
  require_invalid([] { parse_tf_config(R"({"cluster": {"worker": ["a:1", "b"]}, "task": {"type": "worker"}})"); },
                  {"TF_CONFIG", "cluster.worker[1]", "'b'"});
  require_invalid([] { parse_tf_config(R"({"cluster": {"worker": ["a:99999"]}, "task": {"type": "worker"}})"); },
                  {"cluster.worker[0]", "port"});
  require_invalid([] { parse_tf_config(R"({"cluster": {"worker": "a:1"}, "task": {"type": "worker"}})"); },
                  {"cluster.worker", "list"});
  require_invalid([] { parse_tf_config(R"({"cluster": {"worker": ["a:1", 7]}, "task": {"type": "worker"}})"); },
                  {"cluster.worker[1]", "string"});
  require_invalid([] { parse_tf_config(R"({"cluster": {"evaluator": ["a:1"]}, "task": {"type": "evaluator"}})"); },
                  {"cluster.evaluator", "not supported"});
  require_invalid([] { parse_tf_config(R"({"cluster": {"chief": ["a:1"], "master": ["b:1"]}, "task": {"type": "chief"}})"); },
                  {"both 'chief' and 'master'"});
  require_invalid([] { parse_tf_config(R"({"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief"}})"); },
                  {"cluster.chief", "at most one"});
  require_invalid([] { parse_tf_config(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}})"); },
                  {"task index 3", "cluster.worker"});
  require_invalid([] { parse_tf_config(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": -1}})"); },
                  {"task.index"});
  require_invalid([] { parse_tf_config(R"({"cluster": {"worker": ["a:1"]}, "task": {"index": 0}})"); }, {"task.type"});
  // Numbers beyond what the fields hold: refused by name, never wrapped or thrown raw.
  require_invalid([] { parse_tf_config(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1e999}})"); },
                  {"TF_CONFIG", "not usable JSON"});
  require_invalid([] { parse_tf_config(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 4294967296}})"); },
                  {"task.index", "4294967296"});
  require_invalid([] { parse_tf_config(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 18446744073709551615}})"); },
                  {"task.index"});
  require_invalid([] { parse_tf_config(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0.5}})"); },
                  {"task.index"});
  require_invalid([] { parse_tf_config(R"({"cluster": {"worker": ["a:1"], "ps": ["a:1"]}, "task": {"type": "ps"}})"); },
                  {"cluster.ps[0]", "listed twice"});
  // One listening address under two names is listed twice too.
  for (const char* alias : {"localhost", "127.000.000.001", "127.1"}) {
    if (!resolves_to_loopback(alias)) {
      WARN(alias << " does not resolve to 127.0.0.1 on this machine");
      continue;
    }
    const std::string config = fmt::format(R"({{"cluster": {{"chief": ["127.0.0.1:4000"], "worker": ["{}:4000"]}}, "task": {{"type": "chief"}}}})", alias);
    require_invalid([&] { parse_tf_config(config); }, {"cluster.worker[0]", "listed twice", "cluster.chief[0] = 127.0.0.1:4000", "same address"});
  }
  CHECK_NOTHROW(parse_tf_config(R"({"cluster": {"chief": ["127.0.0.1:4000"], "worker": ["localhost:4001"]}, "task": {"type": "chief"}})"));
  require_invalid([] { parse_tf_config(R"({"cluster": {"chief": ["127.0.0.1:4000"], "worker": ["[::ffff:127.0.0.1]:4000"]}, "task": {"type": "chief"}})"); },
                  {"cluster.worker[0]", "same address (127.0.0.1 port 4000)"});
  // An address that means every address of a host is where nobody can dial, in any spelling.
  for (const char* wildcard : {"0.0.0.0:4000", "0:4000", "[::]:4000"}) {
    const std::string config = fmt::format(R"({{"cluster": {{"chief": ["127.0.0.1:4001"], "worker": ["{}"]}}, "task": {{"type": "chief"}}}})", wildcard);
    require_invalid([&] { parse_tf_config(config); }, {"cluster.worker[0]", "not an address another process can dial", "every address"});
  }
  require_invalid([] { parse_tf_config(R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps"}})"); },
                  {"neither a chief nor a worker"});
  require_invalid([] { parse_tf_config(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"}, "environment": 3})"); },
                  {"'environment'"});
}

TEST_CASE("SageMaker: a worker and a parameter server on every host, the first host's worker is chief", "[cluster]") {
  const auto env = environment_of({{"SM_HOSTS", R"(["algo-1","algo-2","algo-3"])"}, {"SM_CURRENT_HOST", "algo-2"}});
  const auto found = discover(env);
  REQUIRE(std::holds_alternative<ClusterSpec>(found));
  const auto& spec = std::get<ClusterSpec>(found);
  CHECK(spec.source == "SM_HOSTS");
  CHECK(spec.chief == std::vector<Endpoint>{{"algo-1", 2222}});
  CHECK(spec.workers.size() == 2);
  CHECK(spec.ps == std::vector<Endpoint>{{"algo-1", 2223}, {"algo-2", 2223}, {"algo-3", 2223}});
  CHECK(spec.role == Role::Worker);
  CHECK(spec.index == 0);

  const auto ps = parse_sagemaker(R"(["algo-1","algo-2"])", "algo-1",
                                  environment_of({{"COHORT_ROLE", "ps"}, {"COHORT_PS_PORT", "3000"}}));
  CHECK(ps.role == Role::Ps);
  CHECK(ps.index == 0);
  CHECK(ps.endpoint(ps.rank()) == Endpoint{"algo-1", 3000});
  const auto chief = parse_sagemaker(R"(["algo-1"])", "algo-1", environment_of({}));
  CHECK(chief.is_chief());

  require_invalid([] { parse_sagemaker(R"(["algo-1"])", "algo-9", environment_of({})); }, {"SM_CURRENT_HOST", "algo-9"});
  require_invalid([] { parse_sagemaker("[]", "algo-1", environment_of({})); }, {"SM_HOSTS", "non-empty"});
  require_invalid([] { parse_sagemaker(R"(["a","a"])", "a", environment_of({})); }, {"SM_HOSTS[1]", "twice"});
  require_invalid([] { parse_sagemaker(R"(["a"])", "a", environment_of({{"COHORT_ROLE", "boss"}})); }, {"COHORT_ROLE"});
  require_invalid([] { parse_sagemaker(R"(["a"])", "a", environment_of({{"COHORT_PS_PORT", "2222"}})); },
                  {"COHORT_PS_PORT", "2222"});
  require_invalid([] { discover(environment_of({{"SM_HOSTS", R"(["a"])"}})); }, {"SM_CURRENT_HOST"});
}

TEST_CASE("rank-only environments ask for a rendezvous at the chief's address", "[cluster]") {
  const auto mpi = discover(environment_of({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                            {"MASTER_ADDR", "10.1.1.1"}, {"MASTER_PORT", "29500"}}));
  REQUIRE(std::holds_alternative<RendezvousRequest>(mpi));
  CHECK(std::get<RendezvousRequest>(mpi).rank == 2);
  CHECK(std::get<RendezvousRequest>(mpi).world_size == 4);
  CHECK(std::get<RendezvousRequest>(mpi).chief == Endpoint{"10.1.1.1", 29500});
  CHECK(std::get<RendezvousRequest>(mpi).source == "Open MPI");

  const auto slurm = discover(environment_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "3"}, {"MASTER_ADDR", "n1"},
                                              {"MASTER_PORT", "1234"}, {"COHORT_MASTER_ADDR", "n2"}, {"COHORT_NUM_PS", "1"}}));
  CHECK(std::get<RendezvousRequest>(slurm).chief == Endpoint{"n2", 1234});
  CHECK(std::get<RendezvousRequest>(slurm).num_ps == 1);
  CHECK(std::get<RendezvousRequest>(slurm).source == "Slurm");

  const auto torchrun = discover(environment_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1"}}));
  CHECK(std::get<RendezvousRequest>(torchrun).source == "torchrun");
  // srun torchrun: every process of a node shares its SLURM_PROCID; RANK tells them apart.
  const auto torchrun_under_slurm = discover(environment_of({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"SLURM_PROCID", "1"},
                                                             {"SLURM_NTASKS", "2"}, {"MASTER_ADDR", "n1"}, {"MASTER_PORT", "1"}}));
  CHECK(std::get<RendezvousRequest>(torchrun_under_slurm).source == "torchrun");
  CHECK(std::get<RendezvousRequest>(torchrun_under_slurm).rank == 3);

  // Two descriptions of one process are refused, not resolved by a silent precedence.
  const std::string tf_config = R"({"cluster": {"worker": ["127.0.0.1:4000", "127.0.0.1:4001"]}, "task": {"type": "worker", "index": 1}})";
  require_invalid([&] { discover(environment_of({{"TF_CONFIG", tf_config}, {"RANK", "0"}, {"WORLD_SIZE", "2"}})); },
                  {"TF_CONFIG and RANK are both set"});
  require_invalid([&] { discover(environment_of({{"TF_CONFIG", tf_config}, {"SM_HOSTS", "[]"}})); }, {"TF_CONFIG and SM_HOSTS"});
  require_invalid([&] { discover(environment_of({{"TF_CONFIG", tf_config}, {"OMPI_COMM_WORLD_RANK", "0"}})); },
                  {"TF_CONFIG and OMPI_COMM_WORLD_RANK are both set"});
  // TF_CONFIG lists the parameter servers: a count beside it is a second source.
  require_invalid([&] { discover(environment_of({{"TF_CONFIG", tf_config}, {"COHORT_NUM_PS", "x"}})); },
                  {"TF_CONFIG and COHORT_NUM_PS are both set"});
  require_invalid([] { discover(environment_of({{"SM_HOSTS", R"(["a"])"}, {"SM_CURRENT_HOST", "a"}, {"COHORT_NUM_PS", "1"}})); },
                  {"SM_HOSTS and COHORT_NUM_PS are both set"});
  // Slurm sets SLURM_PROCID for every process of an allocation, also those given TF_CONFIG.
  CHECK(std::get<ClusterSpec>(discover(environment_of({{"TF_CONFIG", tf_config}, {"SLURM_PROCID", "0"}}))).index == 1);
  require_invalid([] { discover(environment_of({{"RANK", "1"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}})); },
                  {"torchrun", "WORLD_SIZE"});
  require_invalid([] { discover(environment_of({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}})); },
                  {"RANK", "'4'"});
  require_invalid([] { discover(environment_of({{"RANK", "x"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}})); },
                  {"RANK", "'x'"});
  require_invalid([] { discover(environment_of({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}})); },
                  {"Open MPI", "MASTER_ADDR"});
  require_invalid([] { discover(environment_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "0"}})); },
                  {"MASTER_PORT"});
  require_invalid([] { discover(environment_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "5"},
                                                {"COHORT_NUM_PS", "2"}})); },
                  {"COHORT_NUM_PS"});
}

TEST_CASE("precedence: TF_CONFIG alone, SageMaker over rank environments, nothing set is a single process", "[cluster]") {
  require_invalid([] {
    discover(environment_of({{"TF_CONFIG", R"({"cluster": {"worker": ["w:1"]}, "task": {"type": "worker"}})"},
                             {"SM_HOSTS", R"(["a"])"}, {"SM_CURRENT_HOST", "a"}, {"RANK", "0"}}));
  }, {"TF_CONFIG and", "both set"});
  const auto sagemaker = discover(environment_of({{"SM_HOSTS", R"(["a"])"}, {"SM_CURRENT_HOST", "a"}, {"RANK", "0"}}));
  CHECK(std::get<ClusterSpec>(sagemaker).source == "SM_HOSTS");
  CHECK(std::holds_alternative<SingleProcess>(discover(environment_of({}))));
}

TEST_CASE("explicit specs are validated like discovered ones", "[cluster]") {
  ClusterSpec spec{.workers = {{"a", 1}, {"b", 2}}, .ps = {{"c", 3}}, .role = Role::Ps, .index = 0};
  spec.validate();
  CHECK(spec.rank() == 2);
  spec.index = 1;
  require_invalid([&] { spec.validate(); }, {"explicit configuration", "task index 1", "cluster.ps"});
  require_invalid([] { parse_endpoint("host:", "peer"); }, {"peer", "port"});
  require_invalid([] { parse_endpoint(":80", "peer"); }, {"peer", "no host"});
  require_invalid([] { parse_endpoint("[::1:80", "peer"); }, {"peer"});
}

TEST_CASE("transports are chosen by name from one registry, which refuses unknown, empty and taken names", "[cluster][comm]") {
  const auto names = comm::transport_names();
  REQUIRE(names.size() >= 2);
  CHECK(names[0] == "shared-memory");
  CHECK(names[1] == "tcp");
  const comm::GroupOptions alone{.addresses = {{"127.0.0.1", 0}}, .secret = "registry test secret"};
  require_invalid([&] { comm::connect_transport("carrier pigeon", alone); },
                  {"no transport named 'carrier pigeon'", "shared-memory, tcp", "register_transport"});
  require_invalid([] { comm::register_transport("", [](const comm::GroupOptions&) { return nullptr; }); }, {"needs a name"});
  require_invalid([] { comm::register_transport("tcp", [](const comm::GroupOptions&) { return nullptr; }); },
                  {"'tcp' is registered already"});
  require_invalid([] { comm::register_transport("empty factory", {}); }, {"empty"});
  static const bool null_maker = [] {
    comm::register_transport("makes nothing", [](const comm::GroupOptions&) { return std::unique_ptr<comm::Transport>(); });
    return true;
  }();
  CHECK(null_maker);
  require_invalid([&] { comm::connect_transport("makes nothing", alone); }, {"the transport 'makes nothing' made no transport"});
  require_invalid([] { with_environment_settings({}, environment_of({{"COHORT_TRANSPORT", ""}})); }, {"COHORT_TRANSPORT", "empty"});
  CHECK(with_environment_settings({}, environment_of({{"COHORT_TRANSPORT", "tcp"}})).transport == "tcp");
  CHECK(with_environment_settings({}, environment_of({{"COHORT_TRANSPORT", "tcp"}, {"COHORT_SHARED_MEMORY", "0"}})).transport == "tcp");
  require_invalid([] { with_environment_settings({}, environment_of({{"COHORT_TRANSPORT", "tcp"}, {"COHORT_SHARED_MEMORY", "1"}})); },
                  {"COHORT_TRANSPORT=tcp and COHORT_SHARED_MEMORY=1 disagree"});
}

TEST_CASE("a cluster makes its transport through the one registered under the name it is given", "[cluster]") {
  comm::InProcessGroup group(2);
  std::vector<comm::GroupOptions> asked;
  static std::function<std::unique_ptr<comm::Transport>(const comm::GroupOptions&)> make;
  make = [&](const comm::GroupOptions& peers) -> std::unique_ptr<comm::Transport> {
    asked.push_back(peers);
    return std::make_unique<comm_test::ForwardingTransport>(group.transport(peers.rank));
  };
  static const bool registered = [] {
    comm::register_transport("in-process test double", [](const comm::GroupOptions& peers) { return make(peers); });
    return true;
  }();
  CHECK(registered);
  cluster::Cluster cluster(ClusterSpec{.chief = {{"127.0.0.1", 4000}}, .workers = {{"127.0.0.1", 4001}},
                                       .role = Role::Worker, .index = 0},
                           {.transport = "in-process test double", .single_copy = false});
  ::setenv("COHORT_SECRET", "transport factory test", 1);  // a distributed cluster loads its secret before connecting
  CHECK(cluster.transport().rank() == 1);
  ::unsetenv("COHORT_SECRET");
  CHECK(&cluster.transport() == &cluster.transport());  // made once
  REQUIRE(asked.size() == 1);
  CHECK(asked[0].addresses.size() == 2);
  CHECK(asked[0].names[0].find("chief 0") != std::string::npos);
  CHECK_FALSE(asked[0].single_copy);
}

TEST_CASE("a cluster discovered from an application's environment takes its secret from there", "[cluster]") {
  ::unsetenv("COHORT_SECRET");
  ::unsetenv("COHORT_SECRET_FILE");
  const std::string tf_config = R"({"cluster": {"chief": ["127.0.0.1:4000"], "worker": ["127.0.0.1:4001"]},
                                   "task": {"type": "worker", "index": 0}})";
  static std::string used;
  static const bool registered = [] {
    comm::register_transport("secret recorder", [](const comm::GroupOptions& peers) -> std::unique_ptr<comm::Transport> {
      used = peers.secret;
      throw IoError("this test connects to no one");
    });
    return true;
  }();
  CHECK(registered);
  auto cluster = Cluster::from_environment(environment_of({{"TF_CONFIG", tf_config}, {"COHORT_SECRET", "an application's own secret"}}),
                                           {.transport = "secret recorder"});
  CHECK_THROWS_AS(cluster.transport(), IoError);
  CHECK(used == "an application's own secret");
  require_invalid([&] { Cluster::from_environment(environment_of({{"TF_CONFIG", tf_config}})); }, {"no shared secret in the environment Cluster::from_environment read"});
  require_invalid([&] {
    Cluster::from_environment(environment_of({{"TF_CONFIG", tf_config}, {"COHORT_SECRET", "one secret of sixteen"}, {"COHORT_SECRET_FILE", "/x"}}));
  }, {"COHORT_SECRET and COHORT_SECRET_FILE are both set"});
  // A single process needs none.
  CHECK_FALSE(Cluster::from_environment(environment_of({})).distributed());
}

TEST_CASE("deadlines come from the environment where it sets them, and nonsense is refused naming it", "[cluster]") {
  using namespace std::chrono_literals;
  const ConnectOptions defaults{.connect_timeout = 60s, .timeout = 60s, .heartbeat_interval = 1s, .peer_timeout = 10s};
  const ConnectOptions set = with_environment_settings(
      defaults, environment_of({{"COHORT_CONNECT_TIMEOUT", "2m"}, {"COHORT_TIMEOUT", "90"}, {"COHORT_HEARTBEAT_INTERVAL", "250ms"},
                                {"COHORT_PEER_TIMEOUT", "1.5s"}}));
  CHECK(set.connect_timeout == 120s);
  CHECK(set.timeout == 90s);
  CHECK(set.heartbeat_interval == 250ms);
  CHECK(set.peer_timeout == 1500ms);
  CHECK(with_environment_settings(defaults, environment_of({{"COHORT_CONNECT_TIMEOUT", "24h"}})).connect_timeout == 24h);
  const ConnectOptions unset = with_environment_settings(defaults, environment_of({}));
  CHECK(unset.peer_timeout == 10s);
  CHECK(unset.connect_timeout == 60s);
  for (const char* bad : {"", "ten", "25h", "-1", "0", "nan", "inf", "1e9", "5 s", "0.0001", "1d"})
    require_invalid([&] { with_environment_settings(defaults, environment_of({{"COHORT_PEER_TIMEOUT", bad}})); },
                    {"COHORT_PEER_TIMEOUT", "duration"});
  require_invalid([&] { with_environment_settings(defaults, environment_of({{"COHORT_HEARTBEAT_INTERVAL", "20s"}})); },
                  {"COHORT_PEER_TIMEOUT", "COHORT_HEARTBEAT_INTERVAL", "longer"});
  require_invalid([] { Cluster::from_environment(environment_of({{"COHORT_TIMEOUT", "soon"}})); }, {"COHORT_TIMEOUT"});
}

TEST_CASE("a cluster's ranks on one host share memory, unless its transport is tcp", "[cluster][comm]") {
  ::setenv("COHORT_SECRET", "shared memory cluster test", 1);
  for (const bool shared : {true, false}) {
    INFO("shared memory " << shared);
    const auto ports = comm_test::free_addresses(2);
    std::vector<std::unique_ptr<cluster::Cluster>> ranks(2);
    comm_test::run_ranks(2, [&](int r) {
      ClusterSpec spec{.chief = {{"127.0.0.1", ports[0].port}}, .workers = {{"127.0.0.1", ports[1].port}},
                       .role = r == 0 ? Role::Chief : Role::Worker, .index = 0};
      ranks[static_cast<std::size_t>(r)] = std::make_unique<cluster::Cluster>(spec, ConnectOptions{.transport = shared ? "shared-memory" : "tcp"});
      comm::barrier(ranks[static_cast<std::size_t>(r)]->transport());  // a pair shares memory once it talks
    });
    for (const auto& rank : ranks) {
      const auto* transport = dynamic_cast<const comm::shm::ShmTransport*>(&rank->transport());
      CHECK((transport != nullptr && transport->shared_memory_peers() == 1) == shared);
    }
  }
  ::unsetenv("COHORT_SECRET");
}

TEST_CASE("COHORT_SHARED_MEMORY and COHORT_SINGLE_COPY turn shared memory and its single copy off or on", "[cluster]") {
  CHECK(with_environment_settings({}, environment_of({})).transport == "shared-memory");
  CHECK(with_environment_settings({}, environment_of({{"COHORT_SHARED_MEMORY", "0"}})).transport == "tcp");
  CHECK(with_environment_settings({.transport = "tcp"}, environment_of({{"COHORT_SHARED_MEMORY", "1"}})).transport == "shared-memory");
  CHECK(with_environment_settings({}, environment_of({})).single_copy);
  CHECK_FALSE(with_environment_settings({}, environment_of({{"COHORT_SINGLE_COPY", "0"}})).single_copy);
  CHECK(with_environment_settings({.single_copy = false}, environment_of({{"COHORT_SINGLE_COPY", "1"}})).single_copy);
  for (const std::string name : {"COHORT_SHARED_MEMORY", "COHORT_SINGLE_COPY"})
    for (const char* bad : {"", "yes", "2"})
      require_invalid([&] { with_environment_settings({}, environment_of({{name, bad}})); }, {name});
}

TEST_CASE("encryption comes from the environment: COHORT_TLS and certificates given together", "[cluster]") {
  CHECK_FALSE(with_environment_settings({}, environment_of({})).tls.enabled);
  CHECK(with_environment_settings({}, environment_of({{"COHORT_TLS", "1"}})).tls.enabled);
  ConnectOptions on;
  on.tls.enabled = true;
  CHECK_FALSE(with_environment_settings(on, environment_of({{"COHORT_TLS", "0"}})).tls.enabled);
  const auto certificates = with_environment_settings(
      {}, environment_of({{"COHORT_TLS", "1"}, {"COHORT_TLS_CERT", "a.pem"}, {"COHORT_TLS_KEY", "a.key"}, {"COHORT_TLS_CA", "ca.pem"}}));
  CHECK(certificates.tls.certificate == "a.pem");
  CHECK(certificates.tls.private_key == "a.key");
  CHECK(certificates.tls.ca == "ca.pem");
  for (const char* bad : {"yes", "true", "", "2"})
    require_invalid([&] { with_environment_settings({}, environment_of({{"COHORT_TLS", bad}})); }, {"COHORT_TLS"});
  require_invalid([] { with_environment_settings({}, environment_of({{"COHORT_TLS", "1"}, {"COHORT_TLS_CERT", "a.pem"}})); },
                  {"COHORT_TLS_CERT", "all three"});
  require_invalid([] {
    with_environment_settings({}, environment_of({{"COHORT_TLS_CERT", "a.pem"}, {"COHORT_TLS_KEY", "a.key"}, {"COHORT_TLS_CA", "c.pem"}}));
  }, {"COHORT_TLS is not 1"});
}

TEST_CASE("ranks on the same host name or address share a host", "[cluster]") {
  const ClusterSpec spec{.chief = {{"10.0.0.1", 2222}},
                         .workers = {{"10.0.0.2", 2222}, {"10.0.0.1", 2223}},
                         .ps = {{"10.0.0.3", 2224}, {"10.0.0.2", 2225}}};
  CHECK(spec.host_of() == std::vector<int>{0, 1, 0, 2, 1});
}
