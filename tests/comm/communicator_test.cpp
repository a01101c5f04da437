// The ring communicator meets the Communicator contract on 1-4 ranks over the in-process transport.
#include <catch2/catch.hpp>

#include "cohort/comm/inproc.hpp"
#include "comm/communicator_contract.hpp"

using namespace cohort;

TEST_CASE("the ring communicator meets the communicator contract", "[comm]") {
  for (int ranks : {1, 2, 3, 4}) {
    INFO(ranks << " ranks");
    comm::InProcessGroup group(ranks);
    comm_test::run_ranks(ranks, [&](int r) {
      auto communicator = comm::make_ring_communicator(group.transport(r));
      comm_test::expect(communicator->name() == "ring" && communicator->size() == ranks, "ring communicator identity");
      comm_test::check_communicator_contract(*communicator);
    });
  }
}

TEST_CASE("a lost rank fails the ring communicator's pending collective", "[comm]") {
  comm::InProcessGroup group(2, std::chrono::seconds(5));
  auto communicator = comm::make_ring_communicator(group.transport(0));
  std::vector<float> values(1000, 1.0f);
  auto work = communicator->allreduce(comm::Buffer::of(values), comm::ReduceOp::Sum);
  group.kill(1);
  CHECK_THROWS_AS(work->wait(std::chrono::seconds(5)), IoError);
}
