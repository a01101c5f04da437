// The transport contract and the collectives, over the in-process transport.
#include <catch2/catch.hpp>

#include <atomic>
#include <thread>

#include "cohort/comm/allreduce_timings.hpp"
#include "cohort/comm/collectives.hpp"
#include "cohort/comm/inproc.hpp"
#include "cohort/comm/progress_deadline.hpp"
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

TEST_CASE("in-process: messages with one tag arrive in order, tags and peers are independent", "[comm]") {
  InProcessGroup group(3, 10s);
  conformance::ordering_and_tags(members(group, 3));
}

TEST_CASE("in-process: empty, large and many messages, a size mismatch is a ProtocolError", "[comm]") {
  InProcessGroup group(2, 10s);
  conformance::sizes_and_mismatch(members(group, 2));
}

TEST_CASE("in-process: progress reaches every rank, and a rank declared stuck is named by all", "[comm]") {
  InProcessGroup group(3, 10s, {"chief 0", "worker 1", "worker 2"});
  conformance::progress_and_stuck(members(group, 3));
}

TEST_CASE("in-process: a rank that announces its failure is named with its reason by all", "[comm]") {
  InProcessGroup group(3, 10s, {"chief 0", "worker 1", "worker 2"});
  conformance::failure_announced(members(group, 3));
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

TEST_CASE("hierarchical allreduce matches a serial sum for hosts of every shape, the same bits everywhere", "[comm][collectives]") {
  using Hosts = std::vector<int>;
  for (const Hosts& host_of : {Hosts{0, 0, 1, 1}, Hosts{0, 1, 1}, Hosts{0, 0, 0, 1, 1}, Hosts{0, 1, 0, 1}, Hosts{2, 0, 2, 1, 0}}) {
    const int n = static_cast<int>(host_of.size());
    InProcessGroup group(n, 10s);
    for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{65537}})
      for (const ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean}) {
        std::vector<float> expected(count, 0.0f);
        for (int r = 0; r < n; ++r) {
          const auto in = conformance::input_of(r, count);
          for (std::size_t i = 0; i < count; ++i) expected[i] += in[i];
        }
        if (op == ReduceOp::Mean)
          for (float& v : expected) v /= static_cast<float>(n);
        std::vector<std::vector<float>> results(static_cast<std::size_t>(n));
        comm_test::run_ranks(n, [&](int r) {
          auto data = conformance::input_of(r, count);
          hierarchical_allreduce(group.transport(r), host_of, std::as_writable_bytes(std::span(data)), {.op = op});
          results[static_cast<std::size_t>(r)] = std::move(data);
        });
        INFO("hosts " << Catch::Detail::stringify(host_of) << " count " << count << " mean " << (op == ReduceOp::Mean));
        for (int r = 0; r < n; ++r) {
          const auto& got = results[static_cast<std::size_t>(r)];
          REQUIRE(got.size() == count);
          for (std::size_t i = 0; i < count; ++i) REQUIRE(got[i] == Approx(expected[i]).epsilon(1e-6));
          CHECK(got == results[0]);
        }
      }
  }
  CHECK(spans_hosts_with_several_ranks(std::vector{0, 0, 1}));
  CHECK_FALSE(spans_hosts_with_several_ranks(std::vector{0, 0, 0}));  // one host
  CHECK_FALSE(spans_hosts_with_several_ranks(std::vector{0, 1, 2}));  // a rank per host: the ring as it is
}

TEST_CASE("in-process: allreduce matches a serial sum for every size and rank count", "[comm][collectives]") {
  for (int n : {1, 2, 3, 4, 5, 8}) {
    InProcessGroup group(n, 10s);
    conformance::allreduce_matches_reference(members(group, n), {0, 1, static_cast<std::size_t>(n - 1), 7, 1000, 65537});
    conformance::allreduce_bfloat16_wire(members(group, n), {0, 1, 7, 1001, 30001});
    conformance::reduce_scatter_then_allgather(members(group, n), {0, 1, 7, 16001});
  }
}

namespace {

// A rank's transport with its cores as told that keeps the largest message it sent; it gathers in segments,
// as TCP does, so that every message is one.
struct CoresAndLargestSend : comm_test::ToldCores {
  using ToldCores::ToldCores;
  std::atomic<std::size_t> largest{0};
  WorkPtr send(int peer, Tag tag, std::span<const std::byte> data) override {
    for (std::size_t seen = largest.load(); data.size() > seen && !largest.compare_exchange_weak(seen, data.size());) {
    }
    return inner.send(peer, tag, data);
  }
  bool gathers_in_segments() const override { return true; }
};

}  // namespace

TEST_CASE("the group agrees on the ring's segments once: the finer ones where any rank's host is short of cores",
          "[comm][collectives]") {
  constexpr int n = 4;
  constexpr std::size_t coarse = std::size_t{256} << 10, fine = std::size_t{128} << 10;
  const std::size_t count = (std::size_t{4} << 20) / sizeof(float) + 3;  // chunks of about 1 MiB: many segments
  InProcessGroup group(n, 20s);
  // The largest message any rank sent in one allreduce on every rank (its sums checked), where `short_rank`
  // alone says its host is short of cores, each rank with timings[r] where given, else none.
  const auto largest_message = [&](int short_rank, std::vector<AllreduceTimings>* timings, AllreduceOptions options, bool scatter = false) {
    std::vector<std::unique_ptr<CoresAndLargestSend>> ranks;
    for (int r = 0; r < n; ++r) ranks.push_back(std::make_unique<CoresAndLargestSend>(group.transport(r), r != short_rank));
    std::vector<std::vector<float>> results(n);
    comm_test::run_ranks(n, [&](int r) {
      auto data = conformance::input_of(r, count - (scatter ? count % n : 0));
      AllreduceOptions mine = options;
      if (timings != nullptr) mine.timings = &(*timings)[static_cast<std::size_t>(r)];
      if (scatter) reduce_scatter(*ranks[static_cast<std::size_t>(r)], std::as_writable_bytes(std::span(data)), mine);
      else allreduce(*ranks[static_cast<std::size_t>(r)], std::as_writable_bytes(std::span(data)), mine);
      results[static_cast<std::size_t>(r)] = std::move(data);
    });
    if (!scatter)
      for (const auto& result : results) REQUIRE(result == conformance::reduction_of_inputs(n, count, ReduceOp::Sum));
    std::size_t largest = 0;
    for (const auto& rank : ranks) largest = std::max(largest, rank->largest.load());
    return largest;
  };
  SECTION("one rank short of cores: every rank cuts 128 KiB segments, in every later call too") {
    std::vector<AllreduceTimings> timings(n);
    CHECK(largest_message(2, &timings, {}) == fine);
    for (const auto& mine : timings) CHECK(mine.short_of_cores() == true);
    CHECK(largest_message(-1, &timings, {}) == fine);  // agreed once: a rank's later view changes nothing
    CHECK(largest_message(-1, &timings, {}, /*scatter=*/true) == fine);
  }
  SECTION("a core per rank everywhere: 256 KiB segments") {
    std::vector<AllreduceTimings> timings(n);
    CHECK(largest_message(-1, &timings, {}) == coarse);
    for (const auto& mine : timings) CHECK(mine.short_of_cores() == false);
  }
  SECTION("without timings to keep an agreement, 256 KiB; segments the caller sets stand") {
    CHECK(largest_message(2, nullptr, {}) == coarse);
    std::vector<AllreduceTimings> timings(n);
    CHECK(largest_message(2, &timings, {.segment_bytes = 64 << 10}) == std::size_t{64} << 10);
    for (const auto& mine : timings) CHECK_FALSE(mine.short_of_cores());
  }
  SECTION("recursive halving and doubling cuts the agreed segments too") {
    std::vector<AllreduceTimings> timings(n);
    CHECK(largest_message(2, &timings, {.latency_optimal_below_bytes = 0, .halving_doubling_below_bytes = std::size_t{1} << 30}) == fine);
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

TEST_CASE("a rank that waits on another is judged by its waiting thread: one frozen mid-wait is idle", "[comm][threads]") {
  using Clock = std::chrono::steady_clock;
  InProcessGroup group(3, 10s);
  // Rank 1 waits on rank 2, which completes nothing; rank 0 waits on rank 1. While rank 1's waiting thread
  // runs, its ticks keep rank 0 waiting, and rank 1 itself names rank 2.
  auto from_two = group.transport(1).recv(2, 7, {});
  auto from_one = group.transport(0).recv(1, 8, {});
  bool one_gave_up = false, zero_gave_up = false;
  Clock::time_point one_ended, zero_ended;
  std::thread one([&] {
    one_gave_up = !await_peer(group.transport(1), 2, from_two, 5, 600ms, nullptr);
    // Then a waiting mark that no longer ticks: a thread frozen in the middle of a wait.
    group.transport(1).report_progress(5 | kWaitingOnPeer);
    one_ended = Clock::now();
  });
  std::thread zero([&] {
    zero_gave_up = !await_peer(group.transport(0), 1, from_one, 3, 400ms, nullptr);
    zero_ended = Clock::now();
  });
  one.join();
  // Bounds the test where the frozen mark would keep rank 0 waiting: what rank 0 waits for comes after 3 s.
  std::thread late([&] {
    std::this_thread::sleep_for(3s);
    group.transport(1).send(0, 8, {})->wait(10s);
  });
  zero.join();
  late.join();
  CHECK(one_gave_up);
  CHECK(zero_gave_up);
  CHECK(zero_ended > one_ended);                   // not before rank 1's ticks stopped
  CHECK(zero_ended - one_ended < 2s);              // but soon after
}
