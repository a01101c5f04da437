// The transport contract and the collectives, over the in-process transport.
#include <catch2/catch.hpp>
#include <cstring>
#include <numeric>

#include "cohort/comm/collectives.hpp"
#include "cohort/comm/inproc.hpp"
#include "cohort/core/error.hpp"
#include "comm_test_util.hpp"

using namespace cohort;
using namespace cohort::comm;
using namespace std::chrono_literals;

namespace {

std::span<const std::byte> bytes(const std::vector<int>& v) { return std::as_bytes(std::span(v)); }
std::span<std::byte> bytes(std::vector<int>& v) { return std::as_writable_bytes(std::span(v)); }

// Rank r's input to a collective: distinct per rank and element, exactly representable sums.
std::vector<float> input_of(int rank, std::size_t count) {
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<float>((rank + 1) * 1000 + static_cast<int>(i % 977));
  return v;
}

}  // namespace

TEST_CASE("messages with one tag arrive in order; tags and peers are independent", "[comm]") {
  InProcessGroup group(3, 5s);
  comm_test::run_ranks(3, [&](int r) {
    Transport& t = group.transport(r);
    if (r == 0) {
      std::vector<std::vector<int>> messages;
      for (int i = 0; i < 50; ++i) messages.push_back({i, i * i});
      std::vector<WorkPtr> works;
      for (int i = 0; i < 50; ++i) works.push_back(t.send(1, 7, bytes(messages[static_cast<std::size_t>(i)])));
      std::vector<int> other{42};
      works.push_back(t.send(1, 8, bytes(other)));
      wait_all(works, t.timeout());
    } else if (r == 1) {
      std::vector<int> other(1);
      t.recv(0, 8, bytes(other))->wait(t.timeout());  // a later tag first: no head-of-line blocking
      CHECK(other[0] == 42);
      for (int i = 0; i < 50; ++i) {
        std::vector<int> got(2);
        t.recv(0, 7, bytes(got))->wait(t.timeout());
        CHECK(got == std::vector<int>{i, i * i});
      }
      std::vector<int> from_two(3);
      t.recv(2, 7, bytes(from_two))->wait(t.timeout());
      CHECK(from_two == std::vector<int>{2, 2, 2});
    } else {
      std::vector<int> mine{2, 2, 2};
      t.send(1, 7, bytes(mine))->wait(t.timeout());
    }
  });
}

TEST_CASE("empty and large messages; a size mismatch is a ProtocolError", "[comm]") {
  InProcessGroup group(2, 5s);
  comm_test::run_ranks(2, [&](int r) {
    Transport& t = group.transport(r);
    std::vector<int> big(3'000'000);
    if (r == 0) {
      std::iota(big.begin(), big.end(), 0);
      std::vector<int> empty, three{1, 2, 3};
      wait_all({t.send(1, 1, bytes(empty)), t.send(1, 2, bytes(big)), t.send(1, 3, bytes(three))}, t.timeout());
    } else {
      std::vector<int> empty;
      t.recv(0, 1, bytes(empty))->wait(t.timeout());
      t.recv(0, 2, bytes(big))->wait(t.timeout());
      CHECK(big[2'999'999] == 2'999'999);
      std::vector<int> two(2);
      CHECK_THROWS_AS(t.recv(0, 3, bytes(two))->wait(t.timeout()), ProtocolError);
    }
  });
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

TEST_CASE("allreduce matches a serial sum for every size and rank count, including 0 and n - 1", "[comm][collectives]") {
  for (int n : {1, 2, 3, 4, 5}) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, static_cast<std::size_t>(n - 1), std::size_t{7},
                              std::size_t{1000}, std::size_t{65537}}) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean}) {
        std::vector<float> expected(count, 0.0f);
        for (int r = 0; r < n; ++r) {
          const auto in = input_of(r, count);
          for (std::size_t i = 0; i < count; ++i) expected[i] += in[i];
        }
        if (op == ReduceOp::Mean)
          for (float& v : expected) v /= static_cast<float>(n);
        InProcessGroup group(n, 10s);
        std::vector<std::vector<float>> results(static_cast<std::size_t>(n));
        comm_test::run_ranks(n, [&](int r) {
          auto data = input_of(r, count);
          // small segments so that the pipelined path runs with several segments per chunk
          allreduce(group.transport(r), data, {.op = op, .segment_bytes = 4 * 100});
          results[static_cast<std::size_t>(r)] = std::move(data);
        });
        INFO("ranks " << n << " count " << count << " mean " << (op == ReduceOp::Mean));
        for (int r = 0; r < n; ++r) {
          const auto& got = results[static_cast<std::size_t>(r)];
          REQUIRE(got.size() == count);
          for (std::size_t i = 0; i < count; ++i) REQUIRE(got[i] == Approx(expected[i]).epsilon(1e-6));
          CHECK(got == results[0]);  // bitwise identical on every rank
        }
      }
    }
  }
}

TEST_CASE("broadcast from every root, allgather and barrier", "[comm][collectives]") {
  for (int n : {1, 2, 3, 5, 8}) {
    InProcessGroup group(n, 10s);
    comm_test::run_ranks(n, [&](int r) {
      Transport& t = group.transport(r);
      for (int root = 0; root < n; ++root) {
        std::vector<int> data(5, r == root ? root + 100 : -1);
        broadcast(t, root, bytes(data));
        CHECK(data == std::vector<int>(5, root + 100));
      }
      std::vector<int> mine{r, r * 10};
      std::vector<int> all(static_cast<std::size_t>(2 * n));
      allgather(t, bytes(mine), bytes(all));
      for (int q = 0; q < n; ++q) {
        CHECK(all[static_cast<std::size_t>(2 * q)] == q);
        CHECK(all[static_cast<std::size_t>(2 * q + 1)] == q * 10);
      }
      barrier(t);
    });
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
