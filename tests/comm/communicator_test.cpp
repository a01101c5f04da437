// The ring communicator meets the Communicator contract on 1-4 ranks over the in-process transport.
#include <catch2/catch.hpp>

#include "cohort/comm/inproc.hpp"
#include "cohort/comm/nccl.hpp"
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

TEST_CASE("after a failed collective the ring communicator starts no other, so peers never misread one for another",
          "[comm]") {
  // Rank 1 is stuck: it never joins. Rank 0's first allreduce times out midway; the next one, already queued,
  // must not send its pieces on the same tags, where rank 1 would take them for the first one's.
  comm::InProcessGroup group(2, std::chrono::milliseconds(200));
  auto communicator = comm::make_ring_communicator(group.transport(0));
  std::vector<float> first(1000, 1.0f), second(10, 1.0f);
  auto failed = communicator->allreduce(comm::Buffer::of(first), comm::ReduceOp::Sum);
  auto next = communicator->allreduce(comm::Buffer::of(second), comm::ReduceOp::Sum);
  CHECK_THROWS_AS(failed->wait(std::chrono::seconds(5)), TimeoutError);
  CHECK_THROWS_WITH(next->wait(std::chrono::seconds(5)),
                    Catch::Contains("was not started: an earlier one on this communicator failed") && Catch::Contains("rank 1 is stuck"));
}

TEST_CASE("a rank that never starts a collective is named stuck by every rank, not the neighbour each waited on",
          "[comm]") {
  // Worker 1 joins the first allreduce, then its training stops (its transport goes on). Worker 0 waits on
  // the chief, its ring neighbour, and the chief on worker 1: both must name worker 1.
  comm::InProcessGroup group(3, std::chrono::milliseconds(300), {"chief 0", "worker 0", "worker 1"});
  std::vector<std::unique_ptr<comm::Communicator>> communicators;
  std::vector<std::vector<float>> values(3, std::vector<float>(3000, 1.0f));
  auto allreduce = [&](int rank) {
    const auto r = static_cast<std::size_t>(rank);
    return communicators[r]->allreduce(comm::Buffer::of(values[r]), comm::ReduceOp::Sum);
  };
  for (int r = 0; r < 3; ++r) communicators.push_back(comm::make_ring_communicator(group.transport(r)));
  std::vector<comm::WorkPtr> first{allreduce(0), allreduce(1), allreduce(2)};
  for (auto& work : first) work->wait(std::chrono::seconds(5));
  const std::vector<comm::WorkPtr> second{allreduce(0), allreduce(1)};
  for (std::size_t r = 0; r < second.size(); ++r) {
    INFO("rank " << r);
    CHECK_THROWS_AS(second[r]->wait(std::chrono::seconds(5)), TimeoutError);
    CHECK_THROWS_WITH(second[r]->wait(std::chrono::seconds(1)),
                      Catch::Contains("worker 1 is stuck") && Catch::Contains("in collective 2") && Catch::Contains("did not start"));
  }
}

TEST_CASE("NCCL is set up only when every rank has a GPU of its own, and every rank hears why not", "[comm]") {
  // The check runs over the host communicator before NCCL is touched, so it runs on machines without a GPU.
  comm::InProcessGroup group(3);
  std::vector<std::string> reasons(3);
  std::vector<int> made(3, 0);  // Catch2 assertions are not thread-safe: checked after the ranks end
  comm_test::run_ranks(3, [&](int r) {
    auto ring = comm::make_ring_communicator(group.transport(r));
    const auto rank = static_cast<std::size_t>(r);
    made[rank] = comm::make_nccl_communicator(*ring, /*gpu=*/-1, reasons[rank]) != nullptr;
  });
  CHECK(made == std::vector<int>{0, 0, 0});
  const std::string expected = comm::nccl_available() ? "rank 0 does not train on a GPU" : "has no NCCL";
  for (const auto& reason : reasons) CHECK_THAT(reason, Catch::Contains(expected));
  CHECK(reasons[0] == reasons[2]);
}
