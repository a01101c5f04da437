#pragma once
// The transport contract as checks that run against any connected group, so that every transport goes
// through the same suite (tests/comm/inproc_test.cpp, tests/comm/tcp_test.cpp).

#include <bit>
#include <cmath>
#include <limits>
#include <memory>
#include <catch2/catch.hpp>
#include <numeric>
#include <thread>
#include <vector>

#include "cohort/comm/collectives.hpp"
#include "cohort/comm/transport.hpp"
#include "cohort/core/error.hpp"
#include "comm_test_util.hpp"

namespace conformance {

using namespace cohort;
using namespace cohort::comm;

inline std::span<const std::byte> bytes(const std::vector<int>& v) { return std::as_bytes(std::span(v)); }
inline std::span<std::byte> bytes(std::vector<int>& v) { return std::as_writable_bytes(std::span(v)); }

// Ranks of one connected group, indexed by rank.
using Group = std::vector<Transport*>;

inline Group members_of(const std::vector<std::unique_ptr<Transport>>& transports) {
  Group group;
  for (const auto& t : transports) group.push_back(t.get());
  return group;
}

// Rank bodies run on threads and check with comm_test::expect (Catch2 assertions are not thread-safe).

// Needs 3 ranks. In-order delivery per tag, no head-of-line blocking across tags, several senders.
inline void ordering_and_tags(const Group& group) {
  comm_test::run_ranks(3, [&](int r) {
    Transport& t = *group[static_cast<std::size_t>(r)];
    if (r == 0) {
      std::vector<std::vector<int>> messages;
      for (int i = 0; i < 200; ++i) messages.push_back({i, i * i});
      std::vector<WorkPtr> works;
      for (int i = 0; i < 200; ++i) works.push_back(t.send(1, 7, bytes(messages[static_cast<std::size_t>(i)])));
      std::vector<int> other{42};
      works.push_back(t.send(1, 8, bytes(other)));
      wait_all(works, t.timeout());
    } else if (r == 1) {
      std::vector<int> other(1);
      t.recv(0, 8, bytes(other))->wait(t.timeout());
      comm_test::expect(other[0] == 42, "tag 8 message");
      for (int i = 0; i < 200; ++i) {
        std::vector<int> got(2);
        t.recv(0, 7, bytes(got))->wait(t.timeout());
        comm_test::expect(got == std::vector<int>{i, i * i}, "message " + std::to_string(i) + " in order");
      }
      std::vector<int> from_two(3);
      t.recv(2, 7, bytes(from_two))->wait(t.timeout());
      comm_test::expect(from_two == std::vector<int>{2, 2, 2}, "message from rank 2");
    } else {
      std::vector<int> mine{2, 2, 2};
      t.send(1, 7, bytes(mine))->wait(t.timeout());
    }
  });
}

// Needs 2 ranks. Zero-byte and 12 MB messages, many receives posted before their sends, a size mismatch
// that fails as ProtocolError naming the sender without disturbing the next message, and a receive that
// nothing answers, whose timeout names its peer and tag.
inline void sizes_and_mismatch(const Group& group) {
  comm_test::run_ranks(2, [&](int r) {
    Transport& t = *group[static_cast<std::size_t>(r)];
    struct Buffers {
      std::vector<int> big = std::vector<int>(3'000'000);
      std::vector<std::vector<int>> many = std::vector<std::vector<int>>(100, std::vector<int>(1000));
      std::vector<int> empty, three{1, 2, 3}, after{9}, two = std::vector<int>(2), one = std::vector<int>(1);
    };
    const auto buffers = std::make_shared<Buffers>();
    const comm_test::KeepOnFailure keep(buffers);
    Buffers& b = *buffers;
    if (r == 0) {
      std::iota(b.big.begin(), b.big.end(), 0);
      for (int i = 0; i < 100; ++i) b.many[static_cast<std::size_t>(i)].assign(1000, i);
      std::vector<WorkPtr> works{t.send(1, 1, bytes(b.empty)), t.send(1, 2, bytes(b.big)), t.send(1, 3, bytes(b.three)),
                                 t.send(1, 3, bytes(b.after))};
      for (int i = 0; i < 100; ++i) works.push_back(t.send(1, 100 + static_cast<Tag>(i), bytes(b.many[static_cast<std::size_t>(i)])));
      wait_all(works, t.timeout());
    } else {
      std::vector<WorkPtr> posted;
      for (int i = 99; i >= 0; --i) posted.push_back(t.recv(0, 100 + static_cast<Tag>(i), bytes(b.many[static_cast<std::size_t>(i)])));
      t.recv(0, 1, bytes(b.empty))->wait(t.timeout());
      t.recv(0, 2, bytes(b.big))->wait(t.timeout());
      comm_test::expect(b.big[2'999'999] == 2'999'999, "large message content");
      comm_test::expect_throws<ProtocolError>([&] { t.recv(0, 3, bytes(b.two))->wait(t.timeout()); }, "size mismatch",
                                              {"from " + t.describe(0), "tag 3"});
      t.recv(0, 3, bytes(b.one))->wait(t.timeout());
      comm_test::expect(b.one[0] == 9, "the message after a mismatch");
      wait_all(posted, t.timeout());
      for (int i = 0; i < 100; ++i)
        comm_test::expect(b.many[static_cast<std::size_t>(i)] == std::vector<int>(1000, i), "pre-posted receive " + std::to_string(i));
      // Posted until the transport ends: its buffer must outlive it.
      const auto unanswered = std::make_shared<std::vector<int>>(1);
      keep_until_exit(unanswered);
      comm_test::expect_throws<TimeoutError>([&] { t.recv(0, 999, bytes(*unanswered))->wait(std::chrono::milliseconds(30)); },
                                             "a receive nothing answers", {"recv from " + t.describe(0) + ", tag 999", "30 ms"});
    }
  });
}

inline std::vector<float> input_of(int rank, std::size_t count) {
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<float>((rank + 1) * 1000 + static_cast<int>(i % 977));
  return v;
}

// The serial sum (or mean) of every rank's input_of(rank, count).
inline std::vector<float> reduction_of_inputs(int ranks, std::size_t count, ReduceOp op) {
  std::vector<float> expected(count, 0.0f);
  for (int r = 0; r < ranks; ++r) {
    const auto in = input_of(r, count);
    for (std::size_t i = 0; i < count; ++i) expected[i] += in[i];
  }
  if (op == ReduceOp::Mean)
    for (float& v : expected) v /= static_cast<float>(ranks);
  return expected;
}

// Allreduce (sum and mean) against a serial reference, for sizes that do not divide evenly and zero, by
// the ring, by recursive doubling and (on 4, 8, ... ranks) by recursive halving and doubling; every rank ends
// with the same bits.
inline void allreduce_matches_reference(const Group& group, std::initializer_list<std::size_t> counts) {
  const int n = static_cast<int>(group.size());
  constexpr std::size_t kNever = 0, kAlways = std::numeric_limits<std::size_t>::max();
  struct Thresholds {
    std::size_t latency_optimal_below, halving_doubling_below;
  };
  for (std::size_t count : counts) {
    for (const Thresholds thresholds : {Thresholds{kNever, kNever}, Thresholds{kAlways, kNever}, Thresholds{kNever, kAlways}})
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean}) {
      const std::vector<float> expected = reduction_of_inputs(n, count, op);
      std::vector<std::vector<float>> results(static_cast<std::size_t>(n));
      const AllreduceOptions options{.op = op,
                                     .segment_bytes = 4 * 100,
                                     .latency_optimal_below_bytes = thresholds.latency_optimal_below,
                                     .halving_doubling_below_bytes = thresholds.halving_doubling_below};
      comm_test::run_ranks(n, [&](int r) {
        auto data = input_of(r, count);
        allreduce(*group[static_cast<std::size_t>(r)], data, options);
        results[static_cast<std::size_t>(r)] = std::move(data);
      });
      INFO("ranks " << n << " count " << count << " mean " << (op == ReduceOp::Mean) << " by "
                    << allreduce_algorithm(count * sizeof(float), n, options));
      for (int r = 0; r < n; ++r) {
        const auto& got = results[static_cast<std::size_t>(r)];
        REQUIRE(got.size() == count);
        for (std::size_t i = 0; i < count; ++i) REQUIRE(got[i] == Approx(expected[i]).epsilon(1e-6));
        CHECK(got == results[0]);
      }
    }
  }
}

// Allreduce with bfloat16 on the wire, for sizes that do not divide evenly and zero: every rank ends with
// the same bits, each a bfloat16 value, within bfloat16's rounding of each hop of the float32 sum.
inline void allreduce_bfloat16_wire(const Group& group, std::initializer_list<std::size_t> counts) {
  const int n = static_cast<int>(group.size());
  const auto value = [](int rank, std::size_t i) { return std::sin(static_cast<float>(i) * 0.37f + static_cast<float>(rank)) * 3.0f; };
  for (std::size_t count : counts) {
    std::vector<std::vector<float>> results(static_cast<std::size_t>(n));
    comm_test::run_ranks(n, [&](int r) {
      std::vector<float> data(count);
      for (std::size_t i = 0; i < count; ++i) data[i] = value(r, i);
      allreduce(*group[static_cast<std::size_t>(r)], data, {.wire = DType::BFloat16, .segment_bytes = 2 * 100});
      results[static_cast<std::size_t>(r)] = std::move(data);
    });
    INFO("ranks " << n << " count " << count);
    bool rounded_somewhere = false;
    for (std::size_t i = 0; i < count; ++i) {
      double exact = 0, magnitude = 0;
      for (int r = 0; r < n; ++r) {
        exact += value(r, i);
        magnitude += std::abs(value(r, i));
      }
      const float got = results[0][i];
      REQUIRE(round_to(DType::BFloat16, got) == got);
      // One rounding per hop of the partial sums and one of the result, each within half a bfloat16 step.
      REQUIRE(std::abs(got - exact) <= (n + 1) * unit_roundoff(DType::BFloat16) * magnitude + 1e-30);
      rounded_somewhere |= static_cast<double>(got) != static_cast<double>(static_cast<float>(exact));
      for (int r = 1; r < n; ++r) REQUIRE(std::bit_cast<std::uint32_t>(results[static_cast<std::size_t>(r)][i]) == std::bit_cast<std::uint32_t>(got));
    }
    if (n > 1 && count > 10) CHECK(rounded_somewhere);
  }
}

// Reduce-scatter (sum and mean) against a serial reference for blocks of several lengths, zero among them,
// then the in-place allgather of the reduced blocks: every rank ends with the whole sum, in the same bits.
inline void reduce_scatter_then_allgather(const Group& group, std::initializer_list<std::size_t> block_lengths) {
  const int n = static_cast<int>(group.size());
  for (std::size_t block : block_lengths)
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean}) {
      const std::size_t count = block * static_cast<std::size_t>(n);
      const std::vector<float> expected = reduction_of_inputs(n, count, op);
      std::vector<std::vector<float>> reduced(static_cast<std::size_t>(n)), gathered(static_cast<std::size_t>(n));
      comm_test::run_ranks(n, [&](int r) {
        Transport& t = *group[static_cast<std::size_t>(r)];
        auto data = input_of(r, count);
        reduce_scatter(t, std::as_writable_bytes(std::span(data)), {.op = op, .segment_bytes = 4 * 100});
        const auto mine = std::span(data).subspan(static_cast<std::size_t>(r) * block, block);
        reduced[static_cast<std::size_t>(r)].assign(mine.begin(), mine.end());
        allgather(t, std::as_bytes(mine), std::as_writable_bytes(std::span(data)));
        gathered[static_cast<std::size_t>(r)] = std::move(data);
      });
      INFO("ranks " << n << " block " << block << " mean " << (op == ReduceOp::Mean));
      for (int r = 0; r < n; ++r) {
        const auto& mine = reduced[static_cast<std::size_t>(r)];
        for (std::size_t i = 0; i < block; ++i)
          REQUIRE(mine[i] == Approx(expected[static_cast<std::size_t>(r) * block + i]).epsilon(1e-6));
        CHECK(gathered[static_cast<std::size_t>(r)] == gathered[0]);
      }
      for (std::size_t i = 0; i < count; ++i) REQUIRE(gathered[0][i] == Approx(expected[i]).epsilon(1e-6));
    }
  if (n > 1)
    comm_test::run_ranks(n, [&](int r) {
      std::vector<float> uneven(static_cast<std::size_t>(n) + 1);
      comm_test::expect_throws<InvalidArgument>(
          [&] { reduce_scatter(*group[static_cast<std::size_t>(r)], std::as_writable_bytes(std::span(uneven))); },
          "reduce_scatter of a vector that is not whole blocks");
    });
}

inline void broadcast_allgather_barrier(const Group& group) {
  const int n = static_cast<int>(group.size());
  comm_test::run_ranks(n, [&](int r) {
    Transport& t = *group[static_cast<std::size_t>(r)];
    for (int root = 0; root < n; ++root) {
      std::vector<int> data(5, r == root ? root + 100 : -1);
      broadcast(t, root, bytes(data));
      comm_test::expect(data == std::vector<int>(5, root + 100), "broadcast from root " + std::to_string(root));
    }
    std::vector<int> mine{r, r * 10};
    std::vector<int> all(static_cast<std::size_t>(2 * n));
    allgather(t, bytes(mine), bytes(all));
    for (int q = 0; q < n; ++q) {
      comm_test::expect(all[static_cast<std::size_t>(2 * q)] == q && all[static_cast<std::size_t>(2 * q + 1)] == q * 10,
                        "allgather block " + std::to_string(q));
    }
    barrier(t);
  });
}

// Needs 3 ranks; ends the group. Each rank learns the others' progress; rank 0 then declares rank 2 stuck,
// and the operations every rank has pending fail with TimeoutError naming rank 2, not the peer they wait on.
inline void progress_and_stuck(const Group& group) {
  for (int r = 0; r < 3; ++r) group[static_cast<std::size_t>(r)]->report_progress(static_cast<std::uint64_t>(10 + r));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto everyone_heard = [&] {
    for (int r = 0; r < 3; ++r)
      for (int peer = 0; peer < 3; ++peer)
        if (peer != r && group[static_cast<std::size_t>(r)]->progress_of(peer) != static_cast<std::uint64_t>(10 + peer)) return false;
    return true;
  };
  while (!everyone_heard() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(everyone_heard());

  std::vector<int> out(3, 0);
  std::vector<WorkPtr> pending{group[0]->recv(1, 5, bytes(out)), group[1]->recv(0, 5, bytes(out)), group[2]->recv(1, 5, bytes(out))};
  const std::string stuck = group[0]->describe(2) + " is stuck";
  group[0]->declare_stuck(2, stuck + ": it never started collective 11");
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    CHECK_THROWS_AS(pending[static_cast<std::size_t>(r)]->wait(std::chrono::seconds(10)), TimeoutError);
    CHECK_THROWS_WITH(pending[static_cast<std::size_t>(r)]->wait(std::chrono::seconds(1)), Catch::Contains(stuck));
    CHECK_THROWS_WITH(group[static_cast<std::size_t>(r)]->send((r + 1) % 3, 6, bytes(out))->wait(std::chrono::seconds(10)),
                      Catch::Contains(stuck));
  }
}

// Needs 3 ranks; ends the group. Rank 2 announces why it ends: every rank's pending operations fail with
// that reason, naming rank 2.
inline void failure_announced(const Group& group) {
  std::vector<int> out(3, 0);
  std::vector<WorkPtr> pending{group[0]->recv(1, 5, bytes(out)), group[1]->recv(0, 5, bytes(out)), group[2]->recv(0, 5, bytes(out))};
  group[2]->announce_failure("cannot write run/latest.ckpt: No space left on device");
  const std::string expected = group[0]->describe(2) + " failed: cannot write run/latest.ckpt: No space left on device";
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    CHECK_THROWS_AS(pending[static_cast<std::size_t>(r)]->wait(std::chrono::seconds(10)), IoError);
    CHECK_THROWS_WITH(pending[static_cast<std::size_t>(r)]->wait(std::chrono::seconds(1)), Catch::Contains(expected));
  }
}

// Needs 2 ranks; ends the group. Once rank 1 expects messages of at most 512 KiB, one of that size still
// waits for a receive posted after it came, and a larger one that no receive awaits fails rank 1 with
// ProtocolError naming rank 0, before its bytes are buffered.
inline void unexpected_messages_bounded(const Group& group) {
  Transport& zero = *group[0];
  Transport& one = *group[1];
  constexpr std::size_t kExpected = 512 << 10;
  one.expect_messages_up_to(kExpected);
  std::vector<std::byte> fits(kExpected, std::byte{7}), got(kExpected);
  // The refused send may stay in flight until the group closes, after this returns: its bytes outlive it.
  static const std::vector<std::byte> larger(kExpected + 1, std::byte{8});
  zero.send(1, 1, fits)->wait(std::chrono::seconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // so that it is buffered before its receive
  one.recv(0, 1, got)->wait(std::chrono::seconds(10));
  CHECK(got == fits);
  std::vector<int> unrelated(1);
  auto pending = one.recv(0, 3, bytes(unrelated));
  zero.send(1, 2, larger);
  CHECK_THROWS_AS(pending->wait(std::chrono::seconds(10)), ProtocolError);
  CHECK_THROWS_WITH(pending->wait(std::chrono::seconds(1)),
                    Catch::Contains(zero.describe(0)) && Catch::Contains("no receive awaits") &&
                        Catch::Contains(std::to_string(kExpected + 1) + " bytes"));
}

}  // namespace conformance
