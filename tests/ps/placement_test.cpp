// Placement policies against plans computed by hand, partitioning, determinism and the cross-process
// fingerprint check.
#include <catch2/catch.hpp>

#include "cohort/comm/inproc.hpp"
#include "cohort/core/error.hpp"
#include "cohort/ps/placement.hpp"
#include "cohort/ps/verify_plan.hpp"
#include "cohort/ps/snapshot.hpp"
#include "comm/comm_test_util.hpp"

using namespace cohort;
using namespace cohort::ps;

namespace {

// a 40 B, b 120 B, c 80 B, d 80 B (trainable), e 20 B (not trainable), created in that order.
std::vector<VariableInfo> five_variables() {
  return {{"a", {10}, 0, true}, {"b", {5, 6}, 1, true}, {"c", {20}, 2, true}, {"d", {4, 5}, 3, true}, {"e", {5}, 4, false}};
}

std::vector<int> servers_of(const Plan& plan) {
  std::vector<int> out;
  for (const auto& s : plan.shards()) out.push_back(s.server);
  return out;
}

struct AllOnLast {
  std::string name() const { return "AllOnLast"; }
  std::vector<int> assign(const std::vector<Shard>& shards, int servers) const { return std::vector<int>(shards.size(), servers - 1); }
};
static_assert(PlacementPolicy<AllOnLast>);

struct OutOfRange {
  std::string name() const { return "OutOfRange"; }
  std::vector<int> assign(const std::vector<Shard>& shards, int servers) const { return std::vector<int>(shards.size(), servers); }
};

}  // namespace

TEST_CASE("RoundRobin follows creation order, server 0 first", "[ps][placement]") {
  const Plan plan = make_plan(five_variables(), 2, placement::RoundRobin{});
  CHECK(servers_of(plan) == std::vector<int>{0, 1, 0, 1, 0});
  CHECK(plan.bytes_per_server() == std::vector<std::int64_t>{140, 200});
}

TEST_CASE("TensorFlowGreedy: creation order, bytes only, lowest server on ties", "[ps][placement]") {
  // loads: a->0 [40,0], b->1 [40,120], c->0 [120,120], d->0 (tie) [200,120], e->1 [200,140]
  const Plan plan = make_plan(five_variables(), 2, placement::TensorFlowGreedy{}, {.optimizer_slots = 2});
  CHECK(servers_of(plan) == std::vector<int>{0, 1, 0, 0, 1});
  CHECK(plan.bytes_per_server() == std::vector<std::int64_t>{200, 140});
}

TEST_CASE("SizeBalanced: largest load first, counting optimizer slots of trainable variables", "[ps][placement]") {
  // loads with 2 slots: a 120, b 360, c 240, d 240, e 20 (not trainable)
  // b->0 [360,0], c->1 [360,240], d->1 [360,480], a->0 [480,480], e->0 (tie) [500,480]
  const Plan plan = make_plan(five_variables(), 2, placement::SizeBalanced{}, {.optimizer_slots = 2});
  CHECK(servers_of(plan) == std::vector<int>{0, 0, 1, 1, 0});
  CHECK(plan.load_per_server() == std::vector<std::int64_t>{500, 480});
  CHECK(plan.imbalance() == Approx(500.0 / 490.0));
}

TEST_CASE("a variable larger than all others together gets a server of its own", "[ps][placement]") {
  std::vector<VariableInfo> variables{{"small_1", {10}, 0}, {"huge", {1000}, 1}, {"small_2", {30}, 2}, {"small_3", {20}, 3}};
  const Plan plan = make_plan(variables, 3, placement::SizeBalanced{});
  CHECK(plan.shards_of("huge")[0]->server == 0);
  for (const char* name : {"small_1", "small_2", "small_3"}) CHECK(plan.shards_of(name)[0]->server != 0);
  CHECK(plan.imbalance() == Approx(4000.0 / (4240.0 / 3)));
  // Partitioned below 1 KiB per shard, the same variable spreads over all servers.
  const Plan split = make_plan(variables, 3, placement::SizeBalanced{}, {.max_shard_bytes = 1024});
  const auto parts = split.shards_of("huge");
  REQUIRE(parts.size() == 4);
  CHECK(parts[0]->name() == "huge/part_0_of_4");
  CHECK(parts[0]->shape == Shape({250}));
  CHECK(split.imbalance() < plan.imbalance());
}

TEST_CASE("partitioning splits along the first axis into near-equal row ranges", "[ps][placement]") {
  const auto shards = make_shards({{"w", {10, 4}, 0}}, {.max_shard_bytes = 64});
  REQUIRE(shards.size() == 3);
  CHECK(shards[0].shape == Shape({4, 4}));
  CHECK(shards[1].shape == Shape({3, 4}));
  CHECK(shards[2].row_begin == 7);
  CHECK(shards[2].row_end == 10);
  CHECK(make_shards({{"v", {2, 100}, 0}}, {.max_shard_bytes = 16}).size() == 2);  // never more shards than rows
}

TEST_CASE("plans are deterministic and fingerprinted, user policies are checked", "[ps][placement]") {
  const Plan one = make_plan(five_variables(), 3, placement::SizeBalanced{}, {.optimizer_slots = 2});
  const Plan two = make_plan(five_variables(), 3, placement::SizeBalanced{}, {.optimizer_slots = 2});
  CHECK(one.fingerprint() == two.fingerprint());
  CHECK(one.fingerprint() != make_plan(five_variables(), 3, placement::RoundRobin{}).fingerprint());
  CHECK(one.fingerprint() != make_plan(five_variables(), 2, placement::SizeBalanced{}, {.optimizer_slots = 2}).fingerprint());
  const Plan mine = make_plan(five_variables(), 4, AllOnLast{});
  CHECK(servers_of(mine) == std::vector<int>(5, 3));
  CHECK_THROWS_WITH(make_plan(five_variables(), 2, OutOfRange{}), Catch::Contains("OutOfRange") && Catch::Contains("server 2"));
  CHECK_THROWS_AS(make_plan(five_variables(), 0, placement::RoundRobin{}), InvalidArgument);
  const std::string table = one.table();
  CHECK(table.find("imbalance (max / mean load)") != std::string::npos);
  CHECK(table.find("ps 2") != std::string::npos);
  CHECK(one.json().find("\"policy\": \"size-balanced\"") != std::string::npos);
}

TEST_CASE("a process with another plan is found at start-up and named", "[ps][placement]") {
  comm::InProcessGroup group(3, std::chrono::seconds(10), {"chief 0 (h:1)", "worker 0 (h:2)", "worker 1 (h:3)"});
  std::vector<std::string> errors(3);
  comm_test::run_ranks(3, [&](int r) {
    const Plan plan = make_plan(five_variables(), r == 2 ? 3 : 2, placement::SizeBalanced{});
    try {
      verify_same_plan(group.transport(r), plan);
    } catch (const InvalidArgument& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (const auto& e : errors) {
    INFO(e);
    CHECK(e.find("worker 1 (h:3) has") != std::string::npos);
  }
  comm::InProcessGroup agreeing(2);
  comm_test::run_ranks(2, [&](int r) { verify_same_plan(agreeing.transport(r), make_plan(five_variables(), 2, placement::RoundRobin{})); });
}

TEST_CASE("a process stuck before the plans are compared is named by every other, not the neighbour each waits on",
          "[ps][placement]") {
  // Worker 1 never reaches the comparison (its training thread is stuck; its transport goes on).
  comm::InProcessGroup group(3, std::chrono::milliseconds(300), {"chief 0 (h:1)", "worker 0 (h:2)", "worker 1 (h:3)"});
  std::vector<std::string> errors(2);
  comm_test::run_ranks(2, [&](int r) {
    try {
      verify_same_plan(group.transport(r), make_plan(five_variables(), 2, placement::SizeBalanced{}));
    } catch (const TimeoutError& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (const auto& e : errors) {
    INFO(e);
    CHECK(e.find("worker 1 (h:3) is stuck") != std::string::npos);
  }
}

TEST_CASE("variables partition by rows of their first axis, a scalar is one row", "[ps]") {
  CHECK(ps::rows_of(Shape{4, 3}) == 4);
  CHECK(ps::row_elements(Shape{4, 3}) == 3);
  CHECK(ps::rows_of(Shape{}) == 1);
  CHECK(ps::row_elements(Shape{}) == 1);
  // A checkpointed scalar restores like any other variable.
  Tensor saved{Shape{}};
  saved.data()[0] = 2.5f;
  const std::vector<ps::ServerSnapshot> snapshots{{.shards = {{.variable = "scale", .row_begin = 0, .row_end = 1, .value = saved}}}};
  Tensor restored{Shape{}};
  ps::copy_rows(snapshots, "scale", 0, 1, restored, nullptr);
  CHECK(restored.data()[0] == 2.5f);
}
