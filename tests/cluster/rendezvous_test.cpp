// Rank-only environments meet in a rendezvous and come out with roles and a connected transport.
#include <catch2/catch.hpp>

#include "cohort/cluster/cluster.hpp"
#include "cohort/comm/collectives.hpp"
#include "cohort/core/error.hpp"
#include "comm/comm_test_util.hpp"
#include "environment.hpp"

using namespace cohort;
using namespace cohort::cluster;
using cluster_test::environment_of;

TEST_CASE("torchrun-style ranks meet at MASTER_ADDR and get roles, ps last", "[cluster][rendezvous]") {
  const int n = 4;
  const std::string port = std::to_string(comm_test::free_addresses(1)[0].port);
  std::vector<Role> roles(n);
  std::vector<int> indices(n);
  std::vector<float> sums(n);
  comm_test::run_ranks(n, [&](int r) {
    std::map<std::string, std::string> env{{"RANK", std::to_string(r)}, {"WORLD_SIZE", std::to_string(n)},
                                           {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port},
                                           {"COHORT_SECRET", "rendezvous test secret"}};
    if (r == 0) env["COHORT_NUM_PS"] = "1";  // only rank 0's count matters
    auto cluster = Cluster::from_environment(environment_of(env), {.connect_timeout = std::chrono::seconds(20)});
    roles[static_cast<std::size_t>(r)] = cluster.spec().role;
    indices[static_cast<std::size_t>(r)] = cluster.spec().index;
    comm_test::expect(cluster.spec().rank() == r, "the rendezvous keeps the ranks");
    comm_test::expect(cluster.spec().source.find("torchrun rendezvous at 127.0.0.1:" + port) == 0, cluster.spec().source);
    std::vector<float> value{static_cast<float>(r + 1)};
    comm::allreduce(cluster.transport(), value);
    sums[static_cast<std::size_t>(r)] = value[0];
  });
  CHECK(roles == std::vector<Role>{Role::Chief, Role::Worker, Role::Worker, Role::Ps});
  CHECK(indices == std::vector<int>{0, 0, 1, 0});
  CHECK(sums == std::vector<float>(n, 10.0f));
}

TEST_CASE("a rendezvous off loopback needs COHORT_HOST", "[cluster][rendezvous]") {
  CHECK_THROWS_WITH(Cluster::from_environment(environment_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.9.9.9"},
                                                               {"MASTER_PORT", "29500"}})),
                    Catch::Contains("COHORT_HOST"));
  const auto single = Cluster::from_environment(environment_of({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "h"},
                                                                {"MASTER_PORT", "1"}}));
  CHECK_FALSE(single.distributed());
}
