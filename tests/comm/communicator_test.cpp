// The ring communicator meets the Communicator contract on 1-4 ranks over the in-process transport.
#include <catch2/catch.hpp>
#include <functional>
#include <thread>

#include "cohort/comm/inproc.hpp"
#include "cohort/comm/nccl.hpp"
#include "cohort/comm/tcp.hpp"
#include "comm_test_util.hpp"
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

namespace {

// A device whose queued work failed: what a GPU reports for a kernel that faulted.
struct FailedDevice final : DeviceEvent {
  bool finished() const override { throw DeviceError("an illegal memory access was encountered"); }
};

}  // namespace

TEST_CASE("a collective whose buffer its device never writes fails, naming the device's wait, and starts nothing after it",
          "[comm]") {
  // Rank 1 never starts: rank 0 alone shows what its own device's stall does.
  comm::InProcessGroup group(2, std::chrono::milliseconds(100));
  auto communicator = comm::make_ring_communicator(group.transport(0));
  std::vector<float> values(1000, 1.0f), next(10, 1.0f);
  comm::Buffer stalled = comm::Buffer::of(values);
  stalled.ready = std::make_shared<comm_test::GatedEvent>();
  const auto began = std::chrono::steady_clock::now();
  auto failed = communicator->allreduce(stalled, comm::ReduceOp::Sum);
  auto after = communicator->allreduce(comm::Buffer::of(next), comm::ReduceOp::Sum);
  CHECK_THROWS_WITH(failed->wait(std::chrono::seconds(5)),
                    Catch::Contains("allreduce of 4000 bytes") && Catch::Contains("the device did not finish the work that writes its buffer within 400 ms"));
  CHECK(std::chrono::steady_clock::now() - began < std::chrono::seconds(3));
  CHECK_THROWS_WITH(after->wait(std::chrono::seconds(5)), Catch::Contains("was not started"));
  CHECK(group.transport(1).progress_of(0).value_or(0) == 0);  // the stalled collective never told the peers it began

  comm::InProcessGroup pair(2, std::chrono::milliseconds(100));
  auto faulted = comm::make_ring_communicator(pair.transport(0));
  comm::Buffer broken = comm::Buffer::of(values);
  broken.ready = std::make_shared<FailedDevice>();
  CHECK_THROWS_AS(faulted->allreduce(broken, comm::ReduceOp::Sum)->wait(std::chrono::seconds(5)), DeviceError);
}

TEST_CASE("a hierarchical ring's leaders do not settle for the whole group what it agrees on: a reduce-scatter "
          "after a large allreduce still pairs up",
          "[comm]") {
  // Two hosts of two ranks: the leaders' allreduce of 4 MiB runs their ring in segments; the flat group's
  // reduce-scatter after it agrees on its segments with every rank.
  constexpr int n = 4;
  comm::InProcessGroup group(n, std::chrono::seconds(10));
  std::vector<std::unique_ptr<comm::Communicator>> communicators;
  for (int r = 0; r < n; ++r) communicators.push_back(comm::make_ring_communicator(group.transport(r), {0, 0, 1, 1}));
  REQUIRE(communicators[0]->name() == "hierarchical ring");
  std::vector<std::vector<float>> values(n, std::vector<float>((std::size_t{4} << 20) / sizeof(float), 1.0f));
  for (const bool scatter : {false, true}) {
    std::vector<comm::WorkPtr> works;
    for (int r = 0; r < n; ++r) {
      const comm::Buffer buffer = comm::Buffer::of(values[static_cast<std::size_t>(r)]);
      works.push_back(scatter ? communicators[static_cast<std::size_t>(r)]->reduce_scatter(buffer, comm::ReduceOp::Sum)
                              : communicators[static_cast<std::size_t>(r)]->allreduce(buffer, comm::ReduceOp::Sum));
    }
    for (auto& work : works) work->wait(std::chrono::seconds(20));
  }
  // After the allreduce every element is 4; each rank's own block of the reduce-scatter then sums the four.
  for (int r = 0; r < n; ++r) {
    const auto& mine = values[static_cast<std::size_t>(r)];
    const std::size_t block = mine.size() / n;
    CHECK(mine[static_cast<std::size_t>(r) * block] == 16.0f);
  }
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

namespace {

// A rank's transport that, as with connections on demand, hears the progress of its ring neighbours only,
// and whose verdict on a stuck peer leaves late (a loaded host): the ranks that hear nothing must wait for it.
struct RingNeighboursOnly : comm_test::ForwardingTransport {
  using ForwardingTransport::ForwardingTransport;
  bool neighbour(int p) const { return p == (rank() + 1) % size() || p == (rank() + size() - 1) % size(); }
  std::optional<std::uint64_t> progress_of(int p) const override { return neighbour(p) ? inner.progress_of(p) : std::nullopt; }
  void declare_stuck(int p, const std::string& reason) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    inner.declare_stuck(p, reason);
  }
};

// Six ranks allreduce once (the ring: 1.2 MB), run `between`, then all but rank 4 allreduce again: every
// other rank must fail with TimeoutError naming `stuck`.
void rank_4_stops(const std::vector<std::unique_ptr<comm::Communicator>>& communicators, const std::string& stuck,
                  const std::function<void()>& between = {}) {
  const int n = static_cast<int>(communicators.size());
  std::vector<std::vector<float>> values(static_cast<std::size_t>(n), std::vector<float>(300000, 1.0f));
  auto allreduce = [&](int rank) {
    const auto r = static_cast<std::size_t>(rank);
    return communicators[r]->allreduce(comm::Buffer::of(values[r]), comm::ReduceOp::Sum);
  };
  std::vector<comm::WorkPtr> first;
  for (int r = 0; r < n; ++r) first.push_back(allreduce(r));
  for (auto& work : first) work->wait(std::chrono::seconds(10));
  if (between) between();
  std::vector<comm::WorkPtr> second;
  for (int r = 0; r < n; ++r)
    if (r != 4) second.push_back(allreduce(r));
  for (std::size_t i = 0; i < second.size(); ++i) {
    INFO("rank " << (i < 4 ? i : i + 1));
    CHECK_THROWS_AS(second[i]->wait(std::chrono::seconds(10)), TimeoutError);
    CHECK_THROWS_WITH(second[i]->wait(std::chrono::seconds(1)), Catch::Contains(stuck));
  }
}

}  // namespace

TEST_CASE("a rank that hears of no peer behind waits for the verdict of one that does, and names the stuck rank too", "[comm]") {
  constexpr int n = 6;
  comm::InProcessGroup group(n, std::chrono::milliseconds(800));
  std::vector<std::unique_ptr<RingNeighboursOnly>> transports;
  std::vector<std::unique_ptr<comm::Communicator>> communicators;
  for (int r = 0; r < n; ++r) {
    transports.push_back(std::make_unique<RingNeighboursOnly>(group.transport(r)));
    communicators.push_back(comm::make_ring_communicator(*transports.back()));
  }
  rank_4_stops(communicators, "rank 4 is stuck");
}

TEST_CASE("over TCP with connections on demand, a rank that never starts a collective is named stuck by the ranks not linked to it too",
          "[comm]") {
  // Six ranks: the ring's allreduce links each with its neighbours only, so ranks 0 to 2 hear nothing of
  // worker 4 themselves; ranks 3 and 5 name it, and their verdict reaches the others.
  constexpr int n = 6;
  const auto addresses = comm_test::free_addresses(n);
  std::vector<std::unique_ptr<comm::Transport>> transports(n);
  comm_test::run_ranks(n, [&](int r) {
    auto options = comm_test::tcp_options(r, addresses, std::chrono::seconds(3), "a shared secret for tests");
    options.timeout = std::chrono::milliseconds(1500);
    transports[static_cast<std::size_t>(r)] = comm::connect_tcp(options);
  });
  std::vector<std::unique_ptr<comm::Communicator>> communicators;
  for (const auto& transport : transports) communicators.push_back(comm::make_ring_communicator(*transport));
  rank_4_stops(communicators, transports[0]->describe(4) + " is stuck", [&] {
    for (const auto& transport : transports) CHECK(comm::connections_of(*transport) == 2);
  });
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
