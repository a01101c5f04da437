// Shared memory between ranks on one host (connect_group): the shared conformance checks and collectives
// through the rings (also rings smaller than the messages, and groups mixing shared memory and TCP), then
// what a shared-memory peer must still honour: the peer's death or silence noticed through its process,
// what it wrote before a goodbye delivered, segments unlinked once mapped (and those of killed processes
// swept), a pair that cannot share memory falling back to TCP, and ring counters a peer moved out of range.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>
#include <fmt/format.h>
#include <thread>

#include "cohort/comm/allreduce_timings.hpp"
#include "cohort/comm/communicator.hpp"
#include "cohort/comm/shared_memory.hpp"
#include "cohort/core/parallel.hpp"
#include "comm/shm/host_memory.hpp"
#include "comm/shm/mailbox.hpp"
#include "comm/shm/peer_memory.hpp"
#include "comm/shm/shm_transport.hpp"
#include "conformance.hpp"
#include "helper_process.hpp"

using namespace cohort;
using namespace cohort::comm;
using namespace std::chrono_literals;

namespace {

GroupOptions options_for(int rank, const std::vector<Address>& addresses) {
  return comm_test::tcp_options(rank, addresses, 1s, "a shared secret for tests");
}

std::vector<std::unique_ptr<Transport>> connect_ranks(int n, const SharedMemoryOptions& shared = {},
                                                      const std::function<void(int, SharedMemoryOptions&)>& adjust = {}) {
  const auto addresses = comm_test::free_addresses(n);
  std::vector<std::unique_ptr<Transport>> transports(static_cast<std::size_t>(n));
  comm_test::run_ranks(n, [&](int r) {
    SharedMemoryOptions mine = shared;
    if (adjust) adjust(r, mine);
    transports[static_cast<std::size_t>(r)] = connect_group(options_for(r, addresses), mine);
  });
  return transports;
}

const shm::ShmTransport* shm_of(const std::unique_ptr<Transport>& transport) {
  return dynamic_cast<const shm::ShmTransport*>(transport.get());
}

int shared_peers(const std::unique_ptr<Transport>& transport) {
  const auto* shm = shm_of(transport);
  return shm == nullptr ? 0 : shm->shared_memory_peers();
}

std::uint64_t single_copy_messages(const std::unique_ptr<Transport>& transport) {
  const auto* shm = shm_of(transport);
  return shm == nullptr ? 0 : shm->single_copy_messages();
}

// This process's open descriptors of segments: none once its peers have mapped them.
std::vector<std::string> own_segments() {
  std::vector<std::string> found;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const auto target = std::filesystem::read_symlink(entry.path(), error).string();
    if (target.starts_with("/memfd:cohort-")) found.push_back(target);
  }
  return found;
}

// Every mapping of a segment in this process (twice each: by its creator and by its peer), found through
// /proc/self/maps as a peer process would reach them.
struct SegmentMapping {
  std::byte* base;
  std::uint64_t offset;  // into the segment
  std::string inode;     // the same for both mappings of one segment
};

std::vector<SegmentMapping> mapped_segments() {
  std::ifstream maps("/proc/self/maps");
  std::vector<SegmentMapping> found;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/memfd:cohort-") == std::string::npos) continue;
    std::istringstream fields(line);
    std::string range, permissions, offset, device, inode;
    fields >> range >> permissions >> offset >> device >> inode;
    found.push_back({reinterpret_cast<std::byte*>(std::stoull(range.substr(0, range.find('-')), nullptr, 16)),
                     std::stoull(offset, nullptr, 16), inode});
  }
  return found;
}

// The first ring's counters of every segment mapped in this process, once per mapping.
std::vector<shm::RingCounters*> mapped_ring_counters() {
  std::vector<shm::RingCounters*> found;
  for (const SegmentMapping& mapping : mapped_segments())
    if (mapping.offset == 0) found.push_back(reinterpret_cast<shm::RingCounters*>(mapping.base + shm::counters_offset()));
  return found;
}

// Writes `header` into the first ring of every segment mapped in this process (of groups of two ranks,
// whose segments have one ring each) as its writer's next frame.
void forge_frame(const std::array<std::uint64_t, 4>& header) {
  std::set<std::string> segments;
  for (const SegmentMapping& mapping : mapped_segments()) {
    if (!segments.insert(mapping.inode).second) continue;  // mapped by its creator and by its peer
    REQUIRE(mapping.offset == 0);
    auto* counters = reinterpret_cast<shm::RingCounters*>(mapping.base + shm::counters_offset());
    const std::uint64_t head = counters->head.load();
    REQUIRE(head % SharedMemoryOptions{}.ring_bytes + sizeof header <= SharedMemoryOptions{}.ring_bytes);
    std::memcpy(mapping.base + shm::rings_offset(1) + head % SharedMemoryOptions{}.ring_bytes, header.data(), sizeof header);
    counters->head.store(head + sizeof header);
  }
  REQUIRE(segments.size() == 2);
}

// Above SharedMemoryOptions::single_copy_bytes: read from the sender's memory.
constexpr std::size_t kLargeEcho = 3'000'000;

// The two ranks' loopback addresses from a helper's argument "port0,port1".
std::vector<Address> addresses_of(const std::string& ports) {
  const auto comma = ports.find(',');
  return {{"127.0.0.1", static_cast<std::uint16_t>(std::stoi(ports.substr(0, comma)))},
          {"127.0.0.1", static_cast<std::uint16_t>(std::stoi(ports.substr(comma + 1)))}};
}

// Rank 1 of the loss tests in a process of its own: echoes a small message and a large one through shared
// memory, then waits for the test's signal. The argument is "port0,port1".
int shm_peer(const std::string& ports) {
  auto one = connect_group(options_for(1, addresses_of(ports)));
  std::vector<int> value(1), large(kLargeEcho);
  one->recv(0, 1, conformance::bytes(value))->wait(10s);
  one->send(0, 2, conformance::bytes(value))->wait(10s);
  one->recv(0, 6, conformance::bytes(large))->wait(10s);
  one->send(0, 7, conformance::bytes(large))->wait(10s);
  for (;;) std::this_thread::sleep_for(1s);
}

const bool shm_peer_registered = cohort_test::register_helper("shm-peer", shm_peer);

// How many floats the loss test's direct allreduce reduces (64 MiB).
constexpr std::size_t kDirectCount = std::size_t{16} << 20;

// Rank 1 of the direct-allreduce loss test: enters an allreduce by announcing its vector, then dies while
// rank 0 reads it. The argument is "port0,port1".
int shm_direct_peer(const std::string& ports) {
  auto one = connect_group(options_for(1, addresses_of(ports)));
  std::vector<float> vector(kDirectCount, 1.0f), staging(kDirectCount);
  // The first round of direct_allreduce.cpp: where the vector and the staging buffer are, the vector's bytes,
  // and that this rank reaches its peers.
  const std::array<std::uint64_t, 4> announcement{reinterpret_cast<std::uintptr_t>(vector.data()),
                                                  reinterpret_cast<std::uintptr_t>(staging.data()), kDirectCount * sizeof(float), 1};
  std::array<std::uint64_t, 4> theirs{};
  one->send(0, kCollectiveTag, std::as_bytes(std::span(announcement)))->wait(10s);
  one->recv(0, kCollectiveTag, std::as_writable_bytes(std::span(theirs)))->wait(10s);
  ::raise(SIGKILL);
  return 1;
}

const bool shm_direct_peer_registered = cohort_test::register_helper("shm-direct-peer", shm_direct_peer);

// Rank 1 in a process of its own: this test binary again, as the helper above.
class PeerProcess {
 public:
  explicit PeerProcess(const std::vector<Address>& addresses, const char* helper = "shm-peer") : child_(::fork()) {
    REQUIRE(child_ >= 0);
    if (child_ > 0) return;
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    const std::string ports = fmt::format("{},{}", addresses[0].port, addresses[1].port);
    ::execl("/proc/self/exe", "cohort_tests", "--helper", helper, ports.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ~PeerProcess() {
    ::kill(child_, SIGKILL);
    ::waitpid(child_, nullptr, 0);
  }
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;
  void signal(int number) const { ::kill(child_, number); }

 private:
  pid_t child_;
};

}  // namespace

TEST_CASE("shm: the conformance checks, through the rings and by single copy", "[comm][shm]") {
  // Single copy from 1 byte: every message but the empty ones is read from the sender's memory.
  for (const std::size_t single_copy_bytes : {std::size_t{0}, std::size_t{1}, std::size_t{65536}}) {
    for (const std::size_t ring_bytes : {std::size_t{4096}, SharedMemoryOptions{}.ring_bytes}) {
      INFO("rings of " << ring_bytes << " bytes, single copy from " << single_copy_bytes << " bytes");
      const SharedMemoryOptions options{.ring_bytes = ring_bytes, .single_copy_bytes = single_copy_bytes};
      {
        auto group = connect_ranks(3, options);
        conformance::ordering_and_tags(conformance::members_of(group));
        // Pairs share memory once they talk: ranks 0 and 2 never do.
        CHECK(shared_peers(group[0]) == 1);
        CHECK(shared_peers(group[1]) == 2);
        CHECK(shared_peers(group[2]) == 1);
      }
      {
        auto group = connect_ranks(2, options);
        conformance::sizes_and_mismatch(conformance::members_of(group));
        CHECK((single_copy_messages(group[0]) + single_copy_messages(group[1]) > 0) == (single_copy_bytes > 0));
      }
    }
  }
}

TEST_CASE("shm: progress and a stuck rank travel with the liveness, over TCP", "[comm][shm]") {
  auto group = connect_ranks(3);
  conformance::progress_and_stuck(conformance::members_of(group));
}

TEST_CASE("shm: a rank that announces its failure is named with its reason by all", "[comm][shm]") {
  auto group = connect_ranks(3);
  conformance::failure_announced(conformance::members_of(group));
}

TEST_CASE("shm: a message larger than the run expects, which no receive awaits, is refused at once", "[comm][shm][security]") {
  auto group = connect_ranks(2);
  conformance::unexpected_messages_bounded(conformance::members_of(group));
}

TEST_CASE("shm: collectives match the serial reference on 2 to 5 ranks, on one host and across two", "[comm][shm][collectives]") {
  for (int n : {2, 3, 4, 5}) {
    INFO(n << " ranks on one host");
    auto group = connect_ranks(n, {.ring_bytes = 64 * 1024, .single_copy_bytes = 4096});
    conformance::allreduce_matches_reference(conformance::members_of(group), {0, 1, static_cast<std::size_t>(n - 1), 7, 1000, 300001});
    conformance::allreduce_bfloat16_wire(conformance::members_of(group), {0, 1, 7, 1001, 30001});
    conformance::reduce_scatter_then_allgather(conformance::members_of(group), {0, 1, 7, 75001});
    conformance::broadcast_allgather_barrier(conformance::members_of(group));
  }
  // Ranks 0, 2 on "a" and 1, 3 on "b": each rank has one shared-memory peer and two TCP peers.
  auto mixed = connect_ranks(4, {.hosts = {"a", "b", "a", "b"}});
  conformance::allreduce_matches_reference(conformance::members_of(mixed), {0, 5, 300001});
  conformance::reduce_scatter_then_allgather(conformance::members_of(mixed), {3, 75001});
  conformance::broadcast_allgather_barrier(conformance::members_of(mixed));
  for (const auto& t : mixed) CHECK(shared_peers(t) == 1);
}

TEST_CASE("shm: an allreduce on one host reads its peers' memory directly, and matches the serial reference on 2 to 5 ranks",
          "[comm][shm][collectives]") {
  const AllreduceOptions always_direct{.direct_from_bytes = 0};
  for (int n : {2, 3, 4, 5}) {
    auto group = connect_ranks(n);
    const std::string_view direct = "direct (from the peers' memory)";
    CHECK(allreduce_algorithm(*group[0], 4, always_direct) == direct);
    CHECK(allreduce_algorithm(*group[0], 4) == "recursive doubling");
    if (n == 2) {  // a whole vector above a ring's size would stream through it: the ring's halves from 1 MiB
      CHECK(allreduce_algorithm(*group[0], (std::size_t{1} << 20) - 4) == "recursive doubling");
      CHECK(allreduce_algorithm(*group[0], std::size_t{1} << 20) == "ring");
    }
    // By default from 8 MiB on 2 ranks; on more from 128 KiB where each has a core, 512 KiB where they share.
    const std::size_t direct_from = n == 2 ? std::size_t{8} << 20 : n <= usable_cores() ? std::size_t{128} << 10 : std::size_t{512} << 10;
    CHECK(allreduce_algorithm(*group[0], direct_from - 4) != direct);
    CHECK(allreduce_algorithm(*group[0], direct_from) == direct);
    // Below 1 MiB the owners write their chunks into the peers' staging buffers; from 1 MiB the peers read them.
    for (const std::size_t count : {std::size_t{0}, std::size_t{1}, static_cast<std::size_t>(n - 1), std::size_t{7},
                                    std::size_t{1000}, std::size_t{300001}, (std::size_t{1} << 20) + 3}) {
      for (const ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean}) {
        std::vector<std::uint64_t> reads_before, writes_before;
        for (const auto& t : group) {
          reads_before.push_back(shm_of(t)->peer_memory_reads());
          writes_before.push_back(shm_of(t)->peer_memory_writes());
        }
        std::vector<std::vector<float>> results(static_cast<std::size_t>(n));
        comm_test::run_ranks(n, [&](int r) {
          auto data = conformance::input_of(r, count);
          AllreduceOptions options = always_direct;
          options.op = op;
          allreduce(*group[static_cast<std::size_t>(r)], data, options);
          results[static_cast<std::size_t>(r)] = std::move(data);
        });
        INFO(n << " ranks, " << count << " elements, mean " << (op == ReduceOp::Mean));
        const auto expected = conformance::reduction_of_inputs(n, count, op);
        for (int r = 0; r < n; ++r) {
          const auto& got = results[static_cast<std::size_t>(r)];
          REQUIRE(got.size() == count);
          for (std::size_t i = 0; i < count; ++i) REQUIRE(got[i] == Approx(expected[i]).epsilon(1e-6));
          CHECK(got == results[0]);
          // A rank's own chunk is read from each peer in pieces (256 Ki elements where each rank has a core,
          // 64 Ki where they share), then written to each (staged), or the other chunks are read from their owners.
          const auto* shm = shm_of(group[static_cast<std::size_t>(r)]);
          const std::size_t ranks = static_cast<std::size_t>(n), own = count / ranks + (static_cast<std::size_t>(r) < count % ranks ? 1 : 0);
          const std::size_t piece = n <= usable_cores() ? std::size_t{256} << 10 : std::size_t{64} << 10;
          const std::uint64_t pieces = (own + piece - 1) / piece * (ranks - 1);
          const bool staged = count * sizeof(float) < (std::size_t{1} << 20);
          const std::uint64_t owners = std::min(count, ranks) - (static_cast<std::size_t>(r) < count ? 1 : 0);
          CHECK(shm->peer_memory_reads() - reads_before[static_cast<std::size_t>(r)] == pieces + (staged ? 0 : owners));
          CHECK(shm->peer_memory_writes() - writes_before[static_cast<std::size_t>(r)] == (staged ? pieces : 0));
        }
      }
    }
  }
}

TEST_CASE("shm: on 3 ranks the direct allreduce takes over where the group agreed, whatever one rank's own view",
          "[comm][shm][collectives]") {
  constexpr int n = 3;
  // 256 KiB: direct where every rank has a core (from 128 KiB), by messages where some host is short (from 512 KiB).
  const std::size_t count = (std::size_t{256} << 10) / sizeof(float);
  auto group = connect_ranks(n);
  for (const int short_rank : {-1, 1}) {
    INFO("rank short of cores: " << short_rank);
    std::vector<std::unique_ptr<comm_test::ToldCores>> told;
    std::vector<std::uint64_t> reads_before;
    for (int r = 0; r < n; ++r) {
      told.push_back(std::make_unique<comm_test::ToldCores>(*group[static_cast<std::size_t>(r)], r != short_rank));
      reads_before.push_back(shm_of(group[static_cast<std::size_t>(r)])->peer_memory_reads());
    }
    std::vector<AllreduceTimings> timings(n);
    std::vector<std::vector<float>> results(n);
    comm_test::run_ranks(n, [&](int r) {
      auto data = conformance::input_of(r, count);
      allreduce(*told[static_cast<std::size_t>(r)], std::as_writable_bytes(std::span(data)), {.timings = &timings[static_cast<std::size_t>(r)]});
      results[static_cast<std::size_t>(r)] = std::move(data);
    });
    const auto expected = conformance::reduction_of_inputs(n, count, ReduceOp::Sum);
    for (int r = 0; r < n; ++r) {
      CHECK(results[static_cast<std::size_t>(r)] == expected);
      CHECK(timings[static_cast<std::size_t>(r)].short_of_cores() == (short_rank >= 0));
      const std::uint64_t reads = shm_of(group[static_cast<std::size_t>(r)])->peer_memory_reads() - reads_before[static_cast<std::size_t>(r)];
      CHECK((reads > 0) == (short_rank < 0));
    }
  }
}

TEST_CASE("shm: a direct allreduce sums every element in rank order, whichever rank owns it", "[comm][shm][collectives]") {
  // Values whose float sums depend on the order: ((x0 + x1) + x2) + ... is the one the owner must compute.
  const auto value = [](int rank, std::size_t i) { return std::sin(static_cast<float>(i) * 0.37f + static_cast<float>(rank)) * std::pow(10.0f, static_cast<float>(rank % 3) * 3.0f); };
  const std::size_t count = 200003;
  for (int n : {3, 4}) {
    auto group = connect_ranks(n);
    std::vector<std::vector<float>> results(static_cast<std::size_t>(n));
    comm_test::run_ranks(n, [&](int r) {
      std::vector<float> data(count);
      for (std::size_t i = 0; i < count; ++i) data[i] = value(r, i);
      allreduce(*group[static_cast<std::size_t>(r)], data, {.direct_from_bytes = 0});
      results[static_cast<std::size_t>(r)] = std::move(data);
    });
    std::vector<float> expected(count);
    bool order_matters = false;
    for (std::size_t i = 0; i < count; ++i) {
      float sum = value(0, i);
      for (int r = 1; r < n; ++r) sum += value(r, i);
      expected[i] = sum;
      float reversed = value(n - 1, i);
      for (int r = n - 2; r >= 0; --r) reversed += value(r, i);
      order_matters = order_matters || reversed != sum;
    }
    INFO(n << " ranks");
    REQUIRE(order_matters);
    for (const auto& result : results) CHECK(result == expected);
  }
}

TEST_CASE("shm: where one rank may not read its peers' memory, every rank of the allreduce takes the messages' way", "[comm][shm][collectives]") {
  auto group = connect_ranks(3, {}, [](int r, SharedMemoryOptions& options) {
    if (r == 1) options.single_copy_bytes = 0;
  });
  const std::size_t count = 300001;
  std::vector<std::vector<float>> results(3);
  comm_test::run_ranks(3, [&](int r) {
    auto data = conformance::input_of(r, count);
    allreduce(*group[static_cast<std::size_t>(r)], data, {.direct_from_bytes = 0});
    results[static_cast<std::size_t>(r)] = std::move(data);
  });
  CHECK(results[0] == conformance::reduction_of_inputs(3, count, ReduceOp::Sum));
  for (const auto& result : results) CHECK(result == results[0]);
  for (const auto& t : group) CHECK(shm_of(t)->peer_memory_reads() == 0);
}

// A clock on which each trial takes what `durations` gives its candidate (messages, direct, direct in fine
// pieces: in turn), read as each trial begins and ends.
AllreduceTimings::Clock scripted_clock(std::array<std::chrono::microseconds, AllreduceTimings::kCandidates> durations) {
  auto reads = std::make_shared<int>(0);
  auto time = std::make_shared<std::chrono::steady_clock::time_point>();
  return [=] {
    if (*reads % 2 == 1) *time += durations[static_cast<std::size_t>((*reads / 2) % AllreduceTimings::kCandidates)];
    ++*reads;
    return *time;
  };
}

TEST_CASE("allreduce timings: trials take the candidates in turn, each one's best time per byte counts, and the lowest "
          "sum over the ranks is kept",
          "[comm][collectives]") {
  using Algorithm = AllreduceTimings::Algorithm;
  CHECK_FALSE(AllreduceTimings::timed((std::size_t{1} << 20) - 1));
  CHECK(AllreduceTimings::timed(std::size_t{1} << 20));
  CHECK(AllreduceTimings::timed((std::size_t{64} << 20) - 1));
  CHECK_FALSE(AllreduceTimings::timed(std::size_t{64} << 20));
  AllreduceTimings timings(scripted_clock({300us, 200us, 250us}));
  // One band (2 to 4 MiB), sizes up to twice apart: the messages' trials on the smallest vectors.
  const std::size_t small = std::size_t{2} << 20, large = (std::size_t{4} << 20) - 4;
  const auto size_of_trial = [&](int trial) { return trial % AllreduceTimings::kCandidates == 0 ? small : large; };
  for (int trial = 0; trial < AllreduceTimings::kTrials; ++trial) {
    const auto next = timings.next(size_of_trial(trial));
    CHECK(next.trial);
    CHECK(next.algorithm == static_cast<Algorithm>(trial % AllreduceTimings::kCandidates));
    CHECK(timings.record(size_of_trial(trial), timings.now()) == (trial == AllreduceTimings::kTrials - 1));
  }
  CHECK_FALSE(timings.settled(small));
  const auto per_byte = timings.best_seconds_per_byte(small);
  CHECK(per_byte[0] == Approx(300e-6 / static_cast<double>(small)));
  CHECK(per_byte[1] == Approx(200e-6 / static_cast<double>(large)));
  CHECK(per_byte[2] == Approx(250e-6 / static_cast<double>(large)));
  CHECK(timings.settled(std::size_t{1} << 20) == std::nullopt);  // another band, untouched
  // The sums over the ranks decide, not this rank's own times.
  CHECK(timings.settle(small, {0.7f, 0.6f, 0.5f}) == Algorithm::DirectFinePieces);
  CHECK(timings.settled(large) == Algorithm::DirectFinePieces);
  CHECK(timings.next(large).trial == false);
  CHECK_THROWS_WITH(timings.record(small, timings.now()), Catch::Contains("after the last"));
  // A tie keeps the earlier candidate.
  AllreduceTimings tied;
  for (int trial = 0; trial < AllreduceTimings::kTrials; ++trial) tied.record(small, tied.now());
  CHECK(tied.settle(small, {0.5f, 0.5f, 0.5f}) == Algorithm::Messages);
}

TEST_CASE("shm: two ranks time the messages against the direct allreduce in two piece sizes and keep the same one, "
          "whatever each saw alone",
          "[comm][shm][collectives]") {
  using Algorithm = AllreduceTimings::Algorithm;
  const std::size_t count = (std::size_t{2} << 20) / sizeof(float) + 5;  // 2 MiB and a little
  const std::size_t bytes = count * sizeof(float);
  const auto run_calls = [&](std::vector<std::unique_ptr<Transport>>& group, std::array<AllreduceTimings*, 2> timings,
                             int calls, AllreduceOptions options = {}) {
    for (int call = 0; call < calls; ++call) {
      std::vector<std::vector<float>> results(2);
      comm_test::run_ranks(2, [&](int r) {
        auto data = conformance::input_of(r + call, count);
        AllreduceOptions mine = options;
        mine.timings = timings[static_cast<std::size_t>(r)];
        allreduce(*group[static_cast<std::size_t>(r)], data, mine);
        results[static_cast<std::size_t>(r)] = std::move(data);
      });
      auto expected = conformance::input_of(call, count);
      const auto other = conformance::input_of(call + 1, count);
      for (std::size_t i = 0; i < count; ++i) expected[i] += other[i];
      REQUIRE(results[0] == expected);
      REQUIRE(results[1] == expected);
    }
  };
  const auto reads = [](const std::vector<std::unique_ptr<Transport>>& group) {
    return shm_of(group[0])->peer_memory_reads() + shm_of(group[1])->peer_memory_reads();
  };
  // Each rank reads its chunk of just over 1 MiB from its peer in pieces, then the peer's finished chunk at once:
  // 2 + 1 reads in 1 MiB pieces (each rank a core of its own), 5 + 1 in 256 KiB ones.
  const bool own_cores = usable_cores() >= 2;
  const auto reads_by = [&](Algorithm algorithm) -> std::uint64_t {
    if (algorithm == Algorithm::Messages) return 0;
    return 2 * ((algorithm == Algorithm::Direct && own_cores ? 2 : 5) + 1);
  };
  const std::string_view direct = "direct (from the peers' memory)";
  // Rank 0 alone would keep another algorithm than rank 1 and than the sum of both.
  const auto agree = [&](Algorithm faster, std::array<std::chrono::microseconds, 3> rank0,
                         std::array<std::chrono::microseconds, 3> rank1) {
    auto group = connect_ranks(2);
    AllreduceTimings first(scripted_clock(rank0)), second(scripted_clock(rank1));
    CHECK(allreduce_algorithm(*group[0], bytes, {.timings = &first}) == "timed (messages or direct)");
    for (int trial = 0; trial < AllreduceTimings::kTrials; ++trial) {
      const auto before = reads(group);
      run_calls(group, {&first, &second}, 1);
      CHECK(reads(group) - before == reads_by(static_cast<Algorithm>(trial % AllreduceTimings::kCandidates)));
    }
    REQUIRE(first.settled(bytes).has_value());
    CHECK(first.settled(bytes) == faster);
    CHECK(second.settled(bytes) == faster);
    CHECK((allreduce_algorithm(*group[1], bytes, {.timings = &second}) == direct) == (faster != Algorithm::Messages));
    const auto before = reads(group);
    run_calls(group, {&first, &second}, 3);
    CHECK(reads(group) - before == 3 * reads_by(faster));
  };
  SECTION("the direct allreduce in fine pieces faster over both ranks") {
    agree(Algorithm::DirectFinePieces, {100us, 105us, 110us}, {900us, 900us, 100us});
  }
  SECTION("the direct allreduce in its default pieces faster over both ranks") {
    agree(Algorithm::Direct, {100us, 110us, 105us}, {900us, 100us, 900us});
  }
  SECTION("the messages faster over both ranks") { agree(Algorithm::Messages, {110us, 100us, 105us}, {100us, 900us, 900us}); }
  SECTION("a threshold the caller sets turns the timing off") {
    auto group = connect_ranks(2);
    AllreduceTimings first, second;
    run_calls(group, {&first, &second}, AllreduceTimings::kTrials, {.direct_from_bytes = 0});
    CHECK(reads(group) == AllreduceTimings::kTrials * reads_by(Algorithm::Direct));
    CHECK_FALSE(first.settled(bytes));
    CHECK_FALSE(second.settled(bytes));
    CHECK(allreduce_algorithm(*group[0], bytes, {.direct_from_bytes = 0, .timings = &first}) == direct);
  }
  SECTION("where one rank may not read the other's memory, the direct trials count as never ending") {
    auto group = connect_ranks(2, {}, [](int r, SharedMemoryOptions& options) {
      if (r == 1) options.single_copy_bytes = 0;
    });
    AllreduceTimings first(scripted_clock({900us, 1us, 1us})), second(scripted_clock({900us, 1us, 1us}));
    run_calls(group, {&first, &second}, AllreduceTimings::kTrials + 1);
    CHECK(reads(group) == 0);
    CHECK(first.settled(bytes) == Algorithm::Messages);
    CHECK(second.settled(bytes) == Algorithm::Messages);
  }
}

TEST_CASE("shm: the ring communicator times its allreduces on two ranks, with several in flight, and their sums stay right",
          "[comm][shm][collectives]") {
  auto group = connect_ranks(2);
  const std::size_t count = (std::size_t{2} << 20) / sizeof(float), calls = AllreduceTimings::kTrials + 4;
  comm_test::run_ranks(2, [&](int r) {
    auto communicator = make_ring_communicator(*group[static_cast<std::size_t>(r)]);
    std::vector<std::vector<float>> data;
    std::vector<WorkPtr> works;
    for (std::size_t call = 0; call < calls; ++call) data.push_back(conformance::input_of(r + static_cast<int>(call), count));
    for (auto& values : data) works.push_back(communicator->allreduce(Buffer::of(values), ReduceOp::Sum));
    for (std::size_t call = 0; call < calls; ++call) {
      works[call]->wait(std::chrono::seconds(20));
      auto expected = conformance::input_of(static_cast<int>(call), count);
      const auto other = conformance::input_of(static_cast<int>(call) + 1, count);
      for (std::size_t i = 0; i < count; ++i) expected[i] += other[i];
      comm_test::expect(data[call] == expected, "a timed allreduce's sum");
    }
  });
  // The direct trials read the peer's memory.
  CHECK(shm_of(group[0])->peer_memory_reads() > 0);
  CHECK(shm_of(group[1])->peer_memory_reads() > 0);
}

TEST_CASE("shm: a peer that names memory it does not have, or another size, for a direct allreduce fails it with "
          "ProtocolError, naming the peer", "[comm][shm][collectives][security]") {
  // Rank 1 speaks the first round itself: a vector at address 8, which no process maps (read below 1 MiB,
  // staged, and from it); a staging buffer where this test keeps constants (mapped, but not writable:
  // written below 1 MiB); or a vector of another size.
  const std::size_t staged = std::size_t{1} << 17, read = std::size_t{1} << 20;  // floats
  const auto read_only = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(&kDirectCount));
  std::vector<float> vector(read, 1.0f);
  const auto readable = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(vector.data()));
  struct Lie {
    std::size_t count;
    std::array<std::uint64_t, 4> announcement;
    std::string refusal;
  };
  const std::vector<Lie> lies{
      {staged, {8, readable, staged * 4, 1}, "named memory this rank cannot read (not readable memory"},
      {read, {8, readable, read * 4, 1}, "named memory this rank cannot read (not readable memory"},
      {staged, {readable, read_only, staged * 4, 1}, "named memory this rank cannot write (not writable memory"},
      {read, {8, 8, read * 2, 1}, fmt::format("an allreduce of {} bytes where this rank has {}", read * 2, read * 4)}};
  for (const auto& lie : lies) {
    const auto& forged = lie.announcement;
    const auto& expected = lie.refusal;
    const std::size_t count = lie.count;
    auto group = connect_ranks(2);
    std::array<std::uint64_t, 4> theirs{};
    std::string refusal;
    comm_test::run_ranks(2, [&](int r) {
      if (r == 1) {
        auto sent = group[1]->send(0, kCollectiveTag, std::as_bytes(std::span(forged)));
        group[1]->recv(0, kCollectiveTag, std::as_writable_bytes(std::span(theirs)))->wait(5s);
        sent->wait(5s);
        return;
      }
      std::vector<float> data(count, 1.0f);
      try {
        allreduce(*group[0], data, {.direct_from_bytes = 0});
      } catch (const ProtocolError& error) {
        refusal = error.what();
      }
    });
    INFO("the lie: " << expected);
    CHECK_THAT(refusal, Catch::Contains(group[0]->describe(1)) && Catch::Contains(expected));
  }
}

TEST_CASE("shm: a peer that dies while a direct allreduce reads its memory fails it, naming the peer", "[comm][shm][collectives]") {
  const auto addresses = comm_test::free_addresses(2);
  PeerProcess peer(addresses, "shm-direct-peer");
  auto zero = connect_group(options_for(0, addresses));
  std::vector<float> data(kDirectCount, 2.0f);
  const auto began = std::chrono::steady_clock::now();
  std::string failure;
  try {
    allreduce(*zero, data);
  } catch (const IoError& error) {
    failure = error.what();
  }
  CHECK_THAT(failure, Catch::Contains("lost worker 1"));
  CHECK(std::chrono::steady_clock::now() - began < 5s);  // the peer timeout is 1 s
  // The peer's vector was read from its memory (where this kernel lets a parent read its child at all).
  INFO("this rank reads the peer's memory: " << shm_of(zero)->single_copy_sources());
  CHECK((shm_of(zero)->peer_memory_reads() > 0) == (shm_of(zero)->single_copy_sources() > 0));
}

namespace {

// How often rank 0's progress thread stepped aside while its second thread waited briefly for 30 echoes
// from rank 1, a millisecond apart; with `sleeper`, while its first thread slept on a receive meanwhile.
std::uint64_t step_asides_beside_brief_waits(std::vector<std::unique_ptr<Transport>>& group, bool sleeper) {
  std::vector<int> ping{3}, pong(1), value(1), token{4};
  std::thread asleep;
  if (sleeper) {
    asleep = std::thread([&] { group[0]->recv(1, 20, conformance::bytes(value))->wait(5s); });
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (shm_of(group[0])->callers_sleeping() == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(100us);
    REQUIRE(shm_of(group[0])->callers_sleeping() == 1);
  }
  const std::uint64_t before = shm_of(group[0])->step_asides();
  for (int i = 0; i < 30; ++i) {
    group[0]->send(1, 11, conformance::bytes(ping))->wait(5s);
    group[0]->recv(1, 12, conformance::bytes(pong))->wait(5s);
    std::this_thread::sleep_for(1ms);
  }
  const std::uint64_t step_asides = shm_of(group[0])->step_asides() - before;
  if (sleeper) {
    group[1]->send(0, 20, conformance::bytes(token))->wait(5s);
    asleep.join();
    CHECK(value[0] == 4);
  }
  return step_asides;
}

// Rank 1 echoes rank 0's pings while rank 0's progress thread steps aside for the brief waits on the echoes,
// and not while a caller sleeps on its message: parked for the brief waits, the progress thread would leave
// the sleeper's message unread until the next of them polled (0.3-2.4 ms here for a third of the messages,
// where served they took tens of microseconds).
void check_step_asides_for_brief_waits(std::vector<std::unique_ptr<Transport>>& group) {
  std::atomic<bool> stop{false};
  std::thread echoes([&] {
    std::vector<int> pong(1);
    while (true) {
      group[1]->recv(0, 11, conformance::bytes(pong))->wait(5s);
      if (stop.load()) return;
      group[1]->send(0, 12, conformance::bytes(pong))->wait(5s);
    }
  });
  CHECK(step_asides_beside_brief_waits(group, false) > 0);  // callers poll, and nobody sleeps
  // A step aside that had passed its last look at the sleepers when the sleeper fell asleep counts after the
  // test saw it sleep: another round then.
  std::uint64_t with_sleeper = 1;
  for (int round = 0; round < 3 && with_sleeper > 0; ++round) with_sleeper = step_asides_beside_brief_waits(group, true);
  CHECK(with_sleeper == 0);
  stop = true;
  std::vector<int> last{0};
  group[0]->send(1, 11, conformance::bytes(last))->wait(5s);
  echoes.join();
}

// Pins the calling thread, and the threads it starts meanwhile, to the first core it may use; restores its
// cores on destruction.
class OnOneCore {
 public:
  OnOneCore() {
    REQUIRE(::sched_getaffinity(0, sizeof before_, &before_) == 0);
    cpu_set_t one;
    CPU_ZERO(&one);
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &before_)) {
        CPU_SET(cpu, &one);
        break;
      }
    REQUIRE(::sched_setaffinity(0, sizeof one, &one) == 0);
  }
  ~OnOneCore() { ::sched_setaffinity(0, sizeof before_, &before_); }
  OnOneCore(const OnOneCore&) = delete;
  OnOneCore& operator=(const OnOneCore&) = delete;

 private:
  cpu_set_t before_;
};

}  // namespace

TEST_CASE("shm: another thread's brief waits do not keep the progress thread aside while a caller sleeps on its "
          "message", "[comm][shm]") {
  auto group = connect_ranks(2);
  check_step_asides_for_brief_waits(group);
}

TEST_CASE("shm: where the ranks outnumber the cores, the progress thread steps aside for polling callers too",
          "[comm][shm]") {
  // Two ranks on one core: a progress thread that polled beside its callers would take the time slices of the
  // rank that has work (on 4 ranks of 2 cores, 1.1-2.5x slower from 4 KiB to 256 KiB).
  const OnOneCore pinned;
  REQUIRE(usable_cores() == 1);
  auto group = connect_ranks(2);
  check_step_asides_for_brief_waits(group);
}

TEST_CASE("shm: a pair shares memory from its first message, a segment is unlinked once every peer paired, a pair that cannot keeps TCP",
          "[comm][shm]") {
  {
    auto group = connect_ranks(3);
    CHECK(own_segments().size() == 3);  // open while peers may still pair
    for (const auto& t : group) CHECK(shared_peers(t) == 0);
    // Rank 1 has posted nothing when rank 0 sends: its progress thread answers the offer, and the message
    // waits in shared memory for the receive.
    std::vector<int> ping{7}, pong(1);
    auto sent = group[0]->send(1, 3, conformance::bytes(ping));
    sent->wait(5s);
    CHECK(shared_peers(group[0]) == 1);
    group[1]->recv(0, 3, conformance::bytes(pong))->wait(5s);
    CHECK(pong[0] == 7);
    CHECK(shared_peers(group[1]) == 1);
    CHECK(shared_peers(group[2]) == 0);
    CHECK(own_segments().size() == 3);  // rank 2 has paired with nobody, and ranks 0 and 1 not with it
    conformance::broadcast_allgather_barrier(conformance::members_of(group));
    for (const auto& t : group) CHECK(shared_peers(t) == 2);
    CHECK(own_segments().empty());
  }
  // Rings of other sizes: each side refuses the other's segment, and the pair talks over TCP.
  auto group = connect_ranks(2, {}, [](int r, SharedMemoryOptions& options) { options.ring_bytes = r == 0 ? 4096 : 8192; });
  conformance::sizes_and_mismatch(conformance::members_of(group));
  CHECK(own_segments().empty());
  for (const auto& t : group) CHECK(shared_peers(t) == 0);
}

TEST_CASE("shm: the progress thread delivers what arrives while nobody waits, also right after callers polled", "[comm][shm]") {
  auto group = connect_ranks(2);
  std::vector<int> ping{1}, pong(1), early{2}, arrived(1);
  for (int round = 0; round < 5; ++round) {
    INFO("round " << round);
    auto unwatched = group[0]->recv(1, 1, conformance::bytes(arrived));
    // Small messages back and forth, each waited for by a polling caller: the progress thread steps aside.
    std::thread echo([&] {
      for (int i = 0; i < 300; ++i) {
        group[1]->recv(0, 2, conformance::bytes(pong))->wait(5s);
        group[1]->send(0, 3, conformance::bytes(pong))->wait(5s);
      }
    });
    for (int i = 0; i < 300; ++i) {
      auto sent = group[0]->send(1, 2, conformance::bytes(ping));
      group[0]->recv(1, 3, conformance::bytes(ping))->wait(5s);
      sent->wait(5s);
    }
    echo.join();
    // Nobody waits now: the message must reach its receive through the progress thread, soon.
    group[1]->send(0, 1, conformance::bytes(early))->wait(5s);
    const auto deadline = std::chrono::steady_clock::now() + 2s;
    while (!unwatched->done() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
    REQUIRE(unwatched->done());
    CHECK(arrived[0] == 2);
  }
}

TEST_CASE("shm: bad options are refused", "[comm][shm]") {
  const auto addresses = comm_test::free_addresses(2);
  CHECK_THROWS_AS(connect_group(options_for(0, addresses), {.hosts = {"a"}}), InvalidArgument);
  CHECK_THROWS_WITH(connect_group(options_for(0, addresses), {.ring_bytes = 100}), Catch::Contains("ring_bytes"));
  CHECK_THROWS_WITH(connect_group(options_for(0, addresses), {.ring_bytes = std::size_t{1} << 40}), Catch::Contains("1 GiB"));
  CHECK_THROWS_WITH(connect_group(options_for(0, addresses), {.mailbox_bytes = 1 << 20}), Catch::Contains("mailbox_bytes"));
}

TEST_CASE("shm: a mailbox shares its budget among its peers' rings, 64 KiB each at least", "[comm][shm]") {
  const SharedMemoryOptions defaults;
  CHECK(ring_bytes_for(defaults, 1) == defaults.ring_bytes);
  CHECK(ring_bytes_for(defaults, 32) == defaults.ring_bytes);
  CHECK(ring_bytes_for(defaults, 33) == 2031616);   // 64 MiB / 33, in whole pages
  CHECK(ring_bytes_for(defaults, 127) == 528384);
  CHECK(ring_bytes_for(defaults, 5000) == 65536);
  CHECK(ring_bytes_for({.ring_bytes = 4096}, 5000) == 4096);
  // 128 ranks on one host reserve about 8 GiB in all, not 32.
  CHECK(128 * shm::Mailbox::bytes_for(127, ring_bytes_for(defaults, 127)) < (std::uint64_t{8} << 30) + (std::uint64_t{64} << 20));

  // Rings of a mailbox's share carry everything, in a group where mailboxes differ: in a star, rank 0 has
  // three peers and the others one.
  const SharedMemoryOptions tight{.ring_bytes = 128 * 1024, .mailbox_bytes = 256 * 1024, .single_copy_bytes = 0};
  auto group = connect_ranks(4, tight);
  for (const auto& t : group) CHECK(shm_of(t)->ring_bytes() == 86016);  // 256 KiB / 3, in whole pages
  conformance::broadcast_allgather_barrier(conformance::members_of(group));
  for (const auto& t : group) CHECK(shared_peers(t) == 3);
  group.clear();

  const auto addresses = comm_test::free_addresses(4);
  std::vector<std::unique_ptr<Transport>> star(4);
  comm_test::run_ranks(4, [&](int r) {
    GroupOptions options = options_for(r, addresses);
    options.star = true;
    star[static_cast<std::size_t>(r)] = connect_group(options, tight);
  });
  CHECK(shm_of(star[0])->ring_bytes() == 86016);
  for (int r = 1; r < 4; ++r) {
    CHECK(shm_of(star[static_cast<std::size_t>(r)])->ring_bytes() == tight.ring_bytes);
    std::vector<int> outgoing(100000, r), back(100000);
    auto sent = star[0]->send(r, 9, conformance::bytes(outgoing));
    auto received = star[static_cast<std::size_t>(r)]->recv(0, 9, conformance::bytes(back));
    sent->wait(10s);
    received->wait(10s);
    CHECK(back == outgoing);
    CHECK(shared_peers(star[static_cast<std::size_t>(r)]) == 1);
  }
  CHECK(shared_peers(star[0]) == 3);
}

TEST_CASE("shm: a host whose ranks would reserve more than half its available memory keeps TCP", "[comm][shm]") {
  CHECK_FALSE(shm::reservation_refusal(std::uint64_t{4} << 30, std::uint64_t{8} << 30));
  const auto refusal = shm::reservation_refusal(std::uint64_t{5} << 30, std::uint64_t{8} << 30);
  REQUIRE(refusal);
  CHECK_THAT(*refusal, Catch::Contains("5.0 GiB") && Catch::Contains("8.0 GiB") && Catch::Contains("mailbox_bytes"));

  const auto available = shm::available_memory_bytes();
  REQUIRE(available);
  CHECK(*available > 0);
  // Rings of 1 GiB for n - 1 peers each: enough ranks that the host would need more than half its memory.
  // Nothing is reserved, so no process here comes near it.
  int n = 2;
  while (static_cast<std::uint64_t>(n) * (n - 1) * (std::uint64_t{1} << 30) <= *available / 2) ++n;
  if (n > 12) {
    WARN("this host has too much memory to ask for more than half of it with a few ranks; skipping");
    return;
  }
  const SharedMemoryOptions huge{.ring_bytes = std::size_t{1} << 30, .mailbox_bytes = static_cast<std::size_t>(n - 1) << 30};
  auto group = connect_ranks(n, huge);
  for (const auto& t : group) CHECK(shared_peers(t) == 0);
  CHECK(own_segments().empty());
  conformance::sizes_and_mismatch(conformance::members_of(group));
}

TEST_CASE("shm: a ring whose peer moves a counter out of range is broken and copies nothing more", "[comm][shm][security]") {
  shm::RingCounters counters;
  std::vector<std::byte> memory(4096), data(100);
  shm::Ring producer(&counters, memory.data(), memory.size()), consumer(&counters, memory.data(), memory.size());
  producer.write(data);
  producer.publish();
  CHECK(consumer.readable_bytes() == 100);
  CHECK(producer.free_bytes() == 3996);
  counters.head = 100 + 4097;  // more published than the ring holds
  CHECK(consumer.readable_bytes() == 0);
  CHECK(consumer.broken());
  counters.tail = 101;  // more taken than written
  CHECK(producer.free_bytes() == 0);
  CHECK(producer.broken());
}

TEST_CASE("shm: ring counters a peer could not have written fail every operation with ProtocolError, naming it", "[comm][shm][security]") {
  for (const bool published : {true, false}) {
    INFO((published ? "head" : "tail") << " moved");
    auto group = connect_ranks(2);
    const auto counters = mapped_ring_counters();
    REQUIRE(counters.size() >= 2);
    std::vector<int> value{1}, out(1);
    if (published) {
      auto waiting = group[0]->recv(1, 1, conformance::bytes(out));
      for (auto* ring : counters) ring->head.fetch_add(std::uint64_t{1} << 40);
      CHECK_THROWS_WITH(waiting->wait(5s), Catch::Contains("worker 1") && Catch::Contains("counters"));
    } else {
      for (auto* ring : counters) ring->tail.fetch_add(std::uint64_t{1} << 40);
      CHECK_THROWS_WITH(group[1]->send(0, 1, conformance::bytes(value))->wait(5s), Catch::Contains("counters"));
    }
    CHECK_THROWS_AS(group[0]->send(1, 2, conformance::bytes(value))->wait(5s), ProtocolError);
  }
}

TEST_CASE("shm: only segment names of cohort's form are opened", "[comm][shm][security]") {
  for (const char* foreign : {"/cohort-4242-0000000000000abc", "/dev/shm/cohort-1", "/proc/self/fd/3", "/proc/1/fd/3/x",
                              "/proc/1/root/etc/passwd", "/proc/01/fd/3", "proc/1/fd/3"}) {
    INFO(foreign);
    CHECK_THROWS_WITH(shm::Mailbox::open(foreign, {}, 1, 4096), Catch::Contains("not one of cohort's"));
  }
}

TEST_CASE("shm: a segment is sealed against shrinking, and an unsealed one is refused", "[comm][shm][security]") {
  shm::Mailbox box = shm::Mailbox::create(2, 4096);
  // A peer, or its creator, that truncates the segment would make every process mapping it die of SIGBUS.
  const int peer_view = ::open(box.name().c_str(), O_RDWR);
  REQUIRE(peer_view >= 0);
  CHECK(::ftruncate(peer_view, 0) != 0);
  CHECK(errno == EPERM);
  ::close(peer_view);
  const shm::Mailbox opened = shm::Mailbox::open(box.name(), box.nonce(), 2, 4096);
  CHECK(opened.ring(1).capacity() == 4096);
  // The same layout in a memory file without seals.
  const int unsealed = ::memfd_create("cohort-test", MFD_CLOEXEC);
  REQUIRE(unsealed >= 0);
  REQUIRE(::ftruncate(unsealed, static_cast<off_t>(std::filesystem::file_size(box.name()))) == 0);
  const std::string path = fmt::format("/proc/{}/fd/{}", ::getpid(), unsealed);
  CHECK_THROWS_WITH(shm::Mailbox::open(path, box.nonce(), 2, 4096), Catch::Contains("not sealed against shrinking"));
  ::close(unsealed);
}

TEST_CASE("shm: a frame above the size limit fails every operation with ProtocolError, naming the peer", "[comm][shm][security]") {
  const auto addresses = comm_test::free_addresses(3);
  std::vector<std::unique_ptr<Transport>> group(3);
  comm_test::run_ranks(3, [&](int r) {
    GroupOptions options = options_for(r, addresses);
    if (r == 0) options.max_frame_bytes = 1000;
    group[static_cast<std::size_t>(r)] = connect_group(options);
  });
  std::vector<int> large(1000, 1), out(1000), small(1);
  auto pending_on_two = group[0]->recv(2, 2, conformance::bytes(small));
  auto sent = group[1]->send(0, 1, conformance::bytes(large));
  CHECK_THROWS_WITH(group[0]->recv(1, 1, conformance::bytes(out))->wait(5s),
                    Catch::Contains("worker 1") && Catch::Contains("4000 bytes") && Catch::Contains("limit of 1000"));
  CHECK_THROWS_AS(pending_on_two->wait(5s), ProtocolError);
  CHECK_THROWS_AS(group[0]->send(2, 1, conformance::bytes(small))->wait(5s), ProtocolError);
  sent->wait(5s);
}

TEST_CASE("shm: a frame naming memory its sender lacks, of no known kind, or acknowledging nothing fails every operation with ProtocolError, naming the peer", "[comm][shm][security]") {
  struct Forged {
    std::array<std::uint64_t, 4> header;  // tag, length, kind (1: single copy, 2: acknowledgement), address
    const char* named;
  };
  for (const Forged& forged : {Forged{{7, 4096, 1, 8}, "not readable memory"}, Forged{{7, 4096, 9, 0}, "unknown kind 9"},
                               Forged{{0, 0, 2, 0}, "acknowledged a message this rank did not send"}}) {
    INFO(forged.named);
    auto group = connect_ranks(2, {.single_copy_bytes = 1});
    std::vector<int> out(1024), value{1};
    auto waiting = group[0]->recv(1, 7, conformance::bytes(out));
    forge_frame(forged.header);
    CHECK_THROWS_WITH(waiting->wait(5s), Catch::Contains("worker 1") && Catch::Contains(forged.named));
    CHECK_THROWS_AS(group[0]->send(1, 2, conformance::bytes(value))->wait(5s), ProtocolError);
  }
}

TEST_CASE("shm: reading a peer's memory copies it, or says why not: an address it does not map, a process that ended", "[comm][shm]") {
  std::vector<std::byte> source(300000), out(300000);
  for (std::size_t i = 0; i < source.size(); ++i) source[i] = static_cast<std::byte>(i * 7);
  REQUIRE_FALSE(shm::read_peer_memory(::getpid(), reinterpret_cast<std::uint64_t>(source.data()), out));
  CHECK(out == source);
  const auto unmapped = shm::read_peer_memory(::getpid(), 8, out);
  REQUIRE(unmapped);
  CHECK_FALSE(unmapped->process_gone());
  CHECK_THAT(unmapped->reason, Catch::Contains("not readable memory"));
  int release[2];
  REQUIRE(::pipe(release) == 0);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(release[1]);  // so that the parent's close ends the read
    char byte;
    (void)!::read(release[0], &byte, 1);
    ::_exit(0);
  }
  auto handle = shm::ProcessHandle::open(child);
  REQUIRE(handle);
  CHECK_FALSE(handle->ended());
  CHECK_FALSE(shm::read_peer_memory(child, reinterpret_cast<std::uint64_t>(source.data()), out));
  ::close(release[1]);
  // Not reaped yet, so that its pid cannot pass to another process meanwhile.
  siginfo_t exited{};
  REQUIRE(::waitid(P_PID, static_cast<id_t>(child), &exited, WEXITED | WNOWAIT) == 0);
  CHECK(handle->ended());
  const auto ended = shm::read_peer_memory(child, reinterpret_cast<std::uint64_t>(source.data()), out);
  ::waitpid(child, nullptr, 0);
  ::close(release[0]);
  REQUIRE(ended);
  CHECK(ended->process_gone());
  CHECK_THAT(ended->reason, Catch::Contains("ended"));
}

TEST_CASE("shm: a scattered read of a peer's memory copies every piece, more than one system call takes, or names the one it failed at",
          "[comm][shm]") {
  // 2500 pieces (more than IOV_MAX per call) of 0 to 40 bytes at odd offsets of one source, each into its own place.
  std::vector<std::byte> source(60000), out(60000, std::byte{0xee});
  for (std::size_t i = 0; i < source.size(); ++i) source[i] = static_cast<std::byte>(i * 13 + 5);
  std::vector<PeerCopy> copies;
  std::vector<std::pair<std::size_t, std::size_t>> pieces;  // (offset, bytes) in both
  for (std::size_t offset = 3, i = 0; i < 2500; ++i) {
    const std::size_t bytes = (i * 7) % 41;
    pieces.emplace_back(offset, bytes);
    copies.push_back({.address = reinterpret_cast<std::uint64_t>(source.data() + offset), .into = std::span(out).subspan(offset, bytes)});
    offset += bytes + 1;  // the byte between two pieces stays untouched
  }
  REQUIRE_FALSE(shm::read_peer_memory(::getpid(), copies));
  std::size_t untouched = 0;
  for (std::size_t i = 0, next_piece = 0; i < out.size(); ++i) {
    while (next_piece < pieces.size() && pieces[next_piece].first + pieces[next_piece].second <= i) ++next_piece;
    const bool inside = next_piece < pieces.size() && i >= pieces[next_piece].first;
    if (inside) REQUIRE(out[i] == source[i]);
    else untouched += out[i] == std::byte{0xee};
  }
  CHECK(untouched + std::accumulate(pieces.begin(), pieces.end(), std::size_t{0}, [](std::size_t sum, const auto& piece) {
          return sum + piece.second;
        }) == out.size());
  // An unreadable piece past the first call's pieces: the error names it.
  copies[1500].address = 8;
  const auto failed = shm::read_peer_memory(::getpid(), copies);
  REQUIRE(failed);
  CHECK(failed->copy == 1500);
  CHECK_THAT(failed->reason, Catch::Contains("not readable memory"));
}

TEST_CASE("shm: a message its sender withdrew is dropped after the copy, its receive failing, and not acknowledged", "[comm][shm]") {
  auto group = connect_ranks(2, {.single_copy_bytes = 1});
  // The sender's side of a failed send: it withdraws its first single-copy message before failing it.
  for (auto* counters : mapped_ring_counters()) counters->withdrawn.store(1);
  std::vector<int> message(1000, 3), out(1000), next{4}, got(1);
  // Posted first: a withdrawn message that no receive awaits is dropped, and the loss of its sender, which
  // withdraws only as it fails or closes, fails the receive later.
  auto receive = group[0]->recv(1, 7, conformance::bytes(out));
  auto sent = group[1]->send(0, 7, conformance::bytes(message));
  CHECK_THROWS_WITH(receive->wait(5s), Catch::Contains("worker 1") && Catch::Contains("withdrew its message of 4000 bytes on tag 7"));
  std::this_thread::sleep_for(50ms);
  CHECK_FALSE(sent->done());
  // The next message is not withdrawn. (A real sender withdraws only as its link fails, so that no send
  // follows that an acknowledgement could be taken for.)
  auto sent_next = group[1]->send(0, 8, conformance::bytes(next));
  group[0]->recv(1, 8, conformance::bytes(got))->wait(5s);
  CHECK(got[0] == 4);
}

TEST_CASE("shm: what a peer wrote before its goodbye is delivered, then operations needing it fail", "[comm][shm]") {
  auto group = connect_ranks(3);
  std::vector<std::vector<int>> messages{{1}, std::vector<int>(3'000'000, 2), {3}};
  std::vector<WorkPtr> sent;
  for (std::size_t i = 0; i < messages.size(); ++i) sent.push_back(group[2]->send(0, 5, conformance::bytes(messages[i])));
  comm::wait_all(sent, 10s);
  group[2].reset();
  std::this_thread::sleep_for(200ms);  // the goodbye arrives before the receives are posted
  for (const auto& message : messages) {
    std::vector<int> got(message.size());
    group[0]->recv(2, 5, conformance::bytes(got))->wait(5s);
    CHECK(got == message);
  }
  std::vector<int> more(1);
  CHECK_THROWS_WITH(group[0]->recv(2, 5, conformance::bytes(more))->wait(5s), Catch::Contains("worker 2") && Catch::Contains("left"));
  std::vector<int> value{4};
  auto still = group[0]->send(1, 1, conformance::bytes(value));
  group[1]->recv(0, 1, conformance::bytes(more))->wait(5s);
  still->wait(5s);
  CHECK(more[0] == 4);
}

TEST_CASE("shm: a peer process that dies or stops fails the operations waiting on it, naming it", "[comm][shm]") {
  for (const int signal : {SIGKILL, SIGSTOP}) {
    INFO("signal " << signal);
    const auto addresses = comm_test::free_addresses(2);
    PeerProcess peer(addresses);
    auto zero = connect_group(options_for(0, addresses));
    std::vector<int> ping{11}, pong(1);
    auto sent = zero->send(1, 1, conformance::bytes(ping));
    zero->recv(1, 2, conformance::bytes(pong))->wait(5s);  // the peer echoes through shared memory
    sent->wait(5s);
    REQUIRE(pong[0] == 11);
    REQUIRE(shared_peers(zero) == 1);
    std::vector<int> large(kLargeEcho), echoed(kLargeEcho);
    for (std::size_t i = 0; i < large.size(); ++i) large[i] = static_cast<int>(i * 3);
    sent = zero->send(1, 6, conformance::bytes(large));
    zero->recv(1, 7, conformance::bytes(echoed))->wait(10s);
    sent->wait(5s);
    REQUIRE(echoed == large);
    // A parent may read its child's memory wherever the kernel allows cross-memory attach at all (not under
    // kernel.yama.ptrace_scope 3, or a filter that forbids the call).
    const auto* shared = shm_of(zero);
    INFO("this rank reads the peer's memory: " << shared->single_copy_sources());
    CHECK(single_copy_messages(zero) == static_cast<std::uint64_t>(shared->single_copy_sources()));
    std::vector<int> big(kLargeEcho, 1), out(1);
    auto waiting = zero->recv(1, 4, conformance::bytes(out));
    const auto hit = std::chrono::steady_clock::now();
    peer.signal(signal);
    // Larger than a ring, or read from this process's memory: the send waits for the peer to read it, which it never will.
    auto blocked_send = zero->send(1, 3, conformance::bytes(big));
    CHECK_THROWS_WITH(waiting->wait(10s), Catch::Contains("lost worker 1"));
    CHECK_THROWS_WITH(blocked_send->wait(10s), Catch::Contains("worker 1"));
    CHECK(std::chrono::steady_clock::now() - hit < 3s);  // the peer timeout is 1 s
    CHECK_THROWS_WITH(zero->send(1, 5, conformance::bytes(ping))->wait(5s), Catch::Contains("lost worker 1"));
  }
}
