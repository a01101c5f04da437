// The transport contract and the collectives, over the in-process transport.
#include <catch2/catch.hpp>

#include "cohort/comm/collectives.hpp"
#include "cohort/comm/inproc.hpp"
#include "cohort/core/error.hpp"
#include "conformance.hpp"

using namespace cohort;
using namespace cohort::comm;
using namespace std::chrono_literals;

using conformance::bytes;

conformance::Group members(InProcessGroup& group, int n) {
  conformance::Group out;
  for (int r = 0; r < n; ++r) out.push_back(&group.transport(r));
  return out;
}

TEST_CASE("in-process: messages with one tag arrive in order; tags and peers are independent", "[comm]") {
  InProcessGroup group(3, 10s);
  conformance::ordering_and_tags(members(group, 3));
}

TEST_CASE("in-process: empty, large and many messages; a size mismatch is a ProtocolError", "[comm]") {
  InProcessGroup group(2, 10s);
  conformance::sizes_and_mismatch(members(group, 2));
}

TEST_CASE("a receive that nothing answers times out with a message naming it", "[comm]") {
  InProcessGroup group(2, 5s, {"chief 0 (a:1)", "worker 0 (b:2)"});
  std::vector<int> out(1);
  CHECK_THROWS_WITH(group.transport(0).recv(1, 9, bytes(out))->wait(50ms),
                    Catch::Contains("recv from worker 0 (b:2), tag 9") && Catch::Contains("50 ms"));
}

TEST_CASE("a killed rank fails every pending and later operation of every rank, naming it", "[comm]") {
  InProcessGroup group(3, 5s, {"chief 0 (h:1)", "worker 0 (h:2)", "ps 0 (h:3)"});
  std::vector<int> out(1);
  auto waiting_on_it = group.transport(0).recv(2, 1, bytes(out));
  auto waiting_elsewhere = group.transport(0).recv(1, 1, bytes(out));
  group.kill(2);
  CHECK_THROWS_WITH(waiting_on_it->wait(1s), Catch::Contains("lost ps 0 (h:3)"));
  CHECK_THROWS_WITH(waiting_elsewhere->wait(1s), Catch::Contains("lost ps 0 (h:3)"));
  CHECK_THROWS_AS(group.transport(1).send(2, 1, bytes(out))->wait(1s), IoError);
  CHECK_THROWS_WITH(group.transport(1).send(0, 1, bytes(out))->wait(1s), Catch::Contains("lost ps 0 (h:3)"));
}

TEST_CASE("in-process: allreduce matches a serial sum for every size and rank count", "[comm][collectives]") {
  for (int n : {1, 2, 3, 4, 5}) {
    InProcessGroup group(n, 10s);
    conformance::allreduce_matches_reference(members(group, n), {0, 1, static_cast<std::size_t>(n - 1), 7, 1000, 65537});
  }
}

TEST_CASE("in-process: broadcast from every root, allgather and barrier", "[comm][collectives]") {
  for (int n : {1, 2, 3, 5, 8}) {
    InProcessGroup group(n, 10s);
    conformance::broadcast_allgather_barrier(members(group, n));
  }
}

TEST_CASE("a rank lost in the middle of an allreduce fails the others with its name, never a hang", "[comm][collectives]") {
  const int n = 4;
  InProcessGroup group(n, 5s, {"chief 0 (h:1)", "worker 0 (h:2)", "worker 1 (h:3)", "worker 2 (h:4)"});
  std::vector<std::string> errors(n);
  comm_test::run_ranks(n, [&](int r) {
    if (r == 2) {
      group.kill(2);  // dies before taking part
      return;
    }
    std::vector<float> data(10000, 1.0f);
    try {
      allreduce(group.transport(r), data);
    } catch (const IoError& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (int r : {0, 1, 3}) {
    INFO("rank " << r << ": " << errors[static_cast<std::size_t>(r)]);
    CHECK(errors[static_cast<std::size_t>(r)].find("lost worker 1 (h:3)") != std::string::npos);
  }
}
