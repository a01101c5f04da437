#include "cohort/comm/collectives.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <functional>
#include <limits>
#include <type_traits>
#include <vector>

#include "cohort/comm/allreduce_timings.hpp"
#include "cohort/core/check.hpp"
#include "cohort/core/format.hpp"
#include "cohort/core/logging.hpp"
#include "comm/chunks.hpp"
#include "comm/direct_allreduce.hpp"

namespace cohort::comm {
namespace {

template <typename T>
std::span<std::byte> bytes_of(std::span<T> values) { return std::as_writable_bytes(values); }

constexpr std::string_view kRecursiveDoubling = "recursive doubling";
constexpr std::string_view kHalvingDoubling = "recursive halving and doubling";
constexpr std::string_view kDirect = "direct (from the peers' memory)";
constexpr std::string_view kBeingTimed = "timed (messages or direct)";

// Where reading the peers' memory overtakes the messages, from the allreduce sweep on 2 cores. On 2 ranks
// 8 MiB, where the ring's messages (half the vector) no longer fit a shared-memory ring: medians of 7-10
// alternating runs, grouped by the cores' placement (`cohort_allreduce_bench --cores`), put the ring through
// the rings at 12.3-13.9 GB/s at 2 MiB and 12.2-13.7 at 4 MiB against 10.0-10.2 for the direct allreduce with
// the cores close, 2.0-2.1 against 1.6-1.7 with them far apart; the direct allreduce led from 8 MiB (7.4-8.1
// against 5.1). On 3 and 4 ranks the messages stayed ahead up to 256 KiB (1.2-2x), since each of the direct
// allreduce's rounds waits for every rank, and ranks without a core of their own get there one time slice at
// a time, where a pairwise exchange waits for one partner. With a core per rank the rounds take microseconds,
// and the direct allreduce's single copy pays from 128 KiB (not measured on such a host). On 2 ranks a
// communicator times both from 1 MiB instead (allreduce_timings.hpp): the Xeon measured since led the other way.
constexpr std::size_t kTwoRanksDirectFrom = std::size_t{8} << 20;
constexpr std::size_t kOwnCoresDirectFrom = std::size_t{128} << 10, kSharedCoresDirectFrom = std::size_t{512} << 10;

// Where the direct allreduce takes over by default, given whether some rank's host is short of cores (unknown:
// taken as short).
std::size_t default_direct_from(int ranks, std::optional<bool> short_of_cores) {
  if (ranks == 2) return kTwoRanksDirectFrom;
  return short_of_cores.value_or(true) ? kSharedCoresDirectFrom : kOwnCoresDirectFrom;
}

// The peers' memory, where the transport has it and an allreduce of `bytes` reads from it: from the caller's
// threshold, else the default, for which short_of_cores() gives the group's verdict where the size could go
// either way.
template <typename Verdict>
PeerMemory* direct_memory(Transport& transport, std::size_t bytes, const AllreduceOptions& options, Verdict&& short_of_cores) {
  PeerMemory* memory = options.wire == DType::Float32 && transport.size() >= 2 ? transport.peer_memory() : nullptr;
  if (memory == nullptr) return nullptr;
  if (options.direct_from_bytes) return bytes >= *options.direct_from_bytes ? memory : nullptr;
  const bool either_way = transport.size() > 2 && bytes >= kOwnCoresDirectFrom && bytes < kSharedCoresDirectFrom;
  return bytes >= default_direct_from(transport.size(), either_way ? short_of_cores() : std::nullopt) ? memory : nullptr;
}

}  // namespace

void barrier(Transport& transport, Tag tag) {
  const int n = transport.size(), r = transport.rank();
  std::byte token{1}, incoming{0};
  for (int distance = 1; distance < n; distance *= 2) {
    auto sent = transport.send((r + distance) % n, tag, {&token, 1});
    auto received = transport.recv((r - distance + n) % n, tag, {&incoming, 1});
    wait_all({sent, received}, transport.timeout());
  }
}

void broadcast(Transport& transport, int root, std::span<std::byte> data, Tag tag) {
  const int n = transport.size();
  COHORT_CHECK(root >= 0 && root < n, "broadcast root {} outside a group of {}", root, n);
  // Binomial tree over ranks renumbered so that the root is 0: log2(n) rounds, each rank receives once.
  const int self = (transport.rank() - root + n) % n;
  auto real = [&](int virtual_rank) { return (virtual_rank + root) % n; };
  int mask = 1;
  while (mask < n) {
    if ((self & mask) != 0) {
      transport.recv(real(self - mask), tag, data)->wait(transport.timeout());
      break;
    }
    mask <<= 1;
  }
  std::vector<WorkPtr> sends;
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (self + mask < n) sends.push_back(transport.send(real(self + mask), tag, data));
  wait_all(sends, transport.timeout());
}

void allgather(Transport& transport, std::span<const std::byte> mine, std::span<std::byte> all, Tag tag) {
  const int n = transport.size(), r = transport.rank();
  const std::size_t block = mine.size();
  COHORT_CHECK(all.size() == block * static_cast<std::size_t>(n), "allgather: {} bytes cannot hold {} blocks of {}",
               all.size(), n, block);
  // `mine` may be this rank's block of `all` already (an allgather in place).
  std::byte* own = all.data() + static_cast<std::size_t>(r) * block;
  if (block > 0 && own != mine.data()) std::memcpy(own, mine.data(), block);
  // Ring: in step s, pass on the block received in step s - 1.
  for (int step = 0; step + 1 < n; ++step) {
    const auto send_block = static_cast<std::size_t>((r - step + n) % n);
    const auto recv_block = static_cast<std::size_t>((r - step - 1 + n) % n);
    auto sent = transport.send((r + 1) % n, tag, all.subspan(send_block * block, block));
    auto received = transport.recv((r - 1 + n) % n, tag, all.subspan(recv_block * block, block));
    wait_all({sent, received}, transport.timeout());
  }
}

namespace {

// The ring's segments where the caller leaves them to the group (with_segments()). Over loopback TCP on
// 2 cores, medians of 5 s of back-to-back allreduces, alternating: where 4 ranks share the 2 cores, 128 KiB
// segments against 256 KiB gave 1.05-1.47x at 1-4 MiB (the ring), and 64 KiB no more than 128 KiB at 1, 2
// and 8 MiB: each rank's turn at the core moves a segment sooner. With a core per rank (2 ranks) 256 KiB
// led, 1.4-1.5x at 4 and 16 MiB. Through shared memory (4 ranks, 256-512 KiB) both measured level.
constexpr std::size_t kSegmentBytes = std::size_t{256} << 10;
constexpr std::size_t kSharedCoresSegmentBytes = std::size_t{128} << 10;

// How many elements of type T make one of the options' segments (at least one).
template <typename T>
std::size_t segment_elements(const AllreduceOptions& options) {
  return std::max<std::size_t>(1, options.segment_bytes.value_or(kSegmentBytes) / sizeof(T));
}

// Calls each(offset, length) for the segments of `segment` elements that cover `size` elements; an empty
// vector is one empty segment, so that both sides of an exchange take the same steps.
template <typename Each>
void for_each_segment(std::size_t size, std::size_t segment, Each&& each) {
  for (std::size_t at = 0; at < size || (at == 0 && size == 0); at += segment) each(at, std::min(segment, size - at));
}

// Sends the finished block `outgoing` to `to` while `incoming` arrives from `from`: in segments of
// `segment` elements where the transport gathers in segments, else each whole.
template <typename T>
void pass_on(Transport& transport, Tag tag, std::size_t segment, int to, std::span<const T> outgoing, int from,
             std::span<T> incoming) {
  if (!transport.gathers_in_segments()) segment = std::max(outgoing.size(), incoming.size()) + 1;
  std::vector<WorkPtr> operations;
  for_each_segment(outgoing.size(), segment, [&](std::size_t at, std::size_t length) {
    operations.push_back(transport.send(to, tag, std::as_bytes(outgoing.subspan(at, length))));
  });
  for_each_segment(incoming.size(), segment, [&](std::size_t at, std::size_t length) {
    operations.push_back(transport.recv(from, tag, bytes_of(incoming.subspan(at, length))));
  });
  wait_all(operations, transport.timeout());
}

// Sends `outgoing` to `to` and adds what `from` sends into `target`, both in segments of `segment` elements:
// all receives are posted up front, so that every segment lands straight in `incoming` at its place, and each
// is added as soon as it is in, while the later ones are still on the wire. An empty vector still goes as one
// empty message, so that both sides take the same steps.
template <typename T>
void send_and_add(Transport& transport, Tag tag, std::size_t segment, int to, std::span<const T> outgoing, int from,
                  std::span<T> target, std::span<T> incoming) {
  std::vector<WorkPtr> sends, receives;
  for_each_segment(outgoing.size(), segment, [&](std::size_t at, std::size_t length) {
    sends.push_back(transport.send(to, tag, std::as_bytes(outgoing.subspan(at, length))));
  });
  for_each_segment(target.size(), segment, [&](std::size_t at, std::size_t length) {
    receives.push_back(transport.recv(from, tag, bytes_of(incoming.subspan(at, length))));
  });
  for (std::size_t s = 0; s < receives.size(); ++s) {
    receives[s]->wait(transport.timeout());
    const std::size_t at = s * segment, end = std::min(target.size(), at + segment);
    for (std::size_t i = at; i < end; ++i) target[i] += incoming[i];
  }
  wait_all(sends, transport.timeout());
}

// Ring allreduce (Patarasuk and Yuan 2009; Horovod, Gloo, NCCL): the vector is cut into n chunks.
// Reduce-scatter: in n - 1 steps every rank sends one chunk to its successor and adds the chunk coming
// from its predecessor, so that afterwards each rank holds the complete sum of one chunk. All-gather:
// n - 1 more steps pass the finished chunks around the ring. Each rank sends and receives 2 (n - 1) / n
// of the vector in total, independent of n, which is bandwidth-optimal; the latency is 2 (n - 1) message
// times. Chunks move in segments, as a pipeline: every step's receives are posted before the previous
// step's additions, and each segment goes on to the successor as soon as it is added (or, gathering, as
// soon as it is in), so that no byte waits in a transport's buffer for its receive and the wire never waits
// for a whole chunk. Every chunk is summed in one fixed order and then copied, so all ranks end with bitwise
// identical results.

// What travels on the wire for float32 data: the floats themselves, whose wire image is the vector itself,
// or bfloat16 bits, whose wire image is a buffer of the same shape: then each rank adds what arrives,
// widened, to its float32 chunk and sends its partial sums rounded to bfloat16, half the bytes per hop.
float widen(float value) { return value; }
float widen(std::uint16_t bits) { return from_bfloat16_bits(bits); }
// The wire image of `values`, and back; no-ops for float32, whose wire image is the vector itself.
template <typename Wire>
void narrow(std::span<const float> values, std::span<Wire> wire) {
  if constexpr (std::is_same_v<Wire, std::uint16_t>)
    for (std::size_t i = 0; i < values.size(); ++i) wire[i] = to_bfloat16_bits(values[i]);
}
template <typename Wire>
void widen(std::span<const Wire> wire, std::span<float> values) {
  if constexpr (std::is_same_v<Wire, std::uint16_t>)
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = widen(wire[i]);
}

// What follows a reduce-scatter: told once the receives of its last step are posted, and then of each
// segment (offset and length in the finished chunk) as it is complete.
struct ReduceScatterEnd {
  std::function<void()> receives_posted;
  std::function<void(std::size_t at, std::size_t length)> finished;
};

// The reduce-scatter half: afterwards rank r holds the complete sum of chunk (r + 1 - shift) mod n. Each
// segment goes out as its wire image (`wire`, cut as `data` is), narrowed from the partial sums just before.
template <typename Wire>
void ring_reduce_scatter(Transport& transport, std::span<float> data, std::span<Wire> wire, const AllreduceOptions& options,
                         int shift, const ReduceScatterEnd& end = {}) {
  const int n = transport.size(), r = transport.rank(), next = (r + 1) % n, previous = (r - 1 + n) % n;
  const auto index = [&](int chunk) { return ((chunk % n) + n) % n; };
  const std::size_t segment = segment_elements<Wire>(options);
  // A step's receives land in one buffer while the step before adds from the other. Reused across calls: a
  // fresh multi-megabyte buffer per call costs page faults on every step.
  thread_local std::array<std::vector<Wire>, 2> incoming;
  const auto post_receives = [&](int step) {
    std::vector<Wire>& buffer = incoming[static_cast<std::size_t>(step % 2)];
    const std::size_t largest_chunk = data.size() / static_cast<std::size_t>(n) + 1;
    if (buffer.size() < largest_chunk) buffer.resize(largest_chunk);
    std::vector<WorkPtr> receives;
    for_each_segment(ring_chunk(data, n, index(r - step - shift - 1)).size(), segment, [&](std::size_t at, std::size_t length) {
      receives.push_back(transport.recv(previous, options.tag, bytes_of(std::span(buffer).subspan(at, length))));
    });
    return receives;
  };
  std::vector<WorkPtr> sends;
  const auto send = [&](int chunk, std::size_t at, std::size_t length) {
    const auto part = ring_chunk(wire, n, chunk).subspan(at, length);
    narrow<Wire>(ring_chunk(data, n, chunk).subspan(at, length), part);
    sends.push_back(transport.send(next, options.tag, std::as_bytes(part)));
  };
  std::vector<WorkPtr> receives = post_receives(0);
  for_each_segment(ring_chunk(data, n, index(r - shift)).size(), segment,
                   [&](std::size_t at, std::size_t length) { send(index(r - shift), at, length); });
  for (int step = 0; step + 1 < n; ++step) {
    const bool last = step + 2 == n;
    std::vector<WorkPtr> following = last ? std::vector<WorkPtr>{} : post_receives(step + 1);
    if (last && end.receives_posted) end.receives_posted();
    const int chunk = index(r - step - shift - 1);
    const auto target = ring_chunk(data, n, chunk);
    const std::span<const Wire> arrived = incoming[static_cast<std::size_t>(step % 2)];
    std::size_t s = 0;
    for_each_segment(target.size(), segment, [&](std::size_t at, std::size_t length) {
      receives[s++]->wait(transport.timeout());
      for (std::size_t i = at; i < at + length; ++i) target[i] += widen(arrived[i]);
      if (!last) send(chunk, at, length);
      else if (end.finished) end.finished(at, length);
    });
    receives = std::move(following);
  }
  wait_all(sends, transport.timeout());
}

// The gathering half passes the finished chunks' wire images around the ring and widens each as it comes.
// Its receives are all posted before the reduce-scatter's last additions. Such a receive cannot overwrite
// a chunk still being sent: a chunk comes back finished only after the ring, this rank's successor
// included, has consumed this rank's part of it. With bfloat16 on the wire, the rank that completes a chunk
// rounds it to bfloat16 and keeps the rounded values, which then travel around unchanged (bfloat16 holds
// them exactly): every rank ends with the same bits.
template <typename Wire>
void ring_allreduce(Transport& transport, std::span<float> data, std::span<Wire> wire, const AllreduceOptions& options) {
  const int n = transport.size(), r = transport.rank(), next = (r + 1) % n, previous = (r - 1 + n) % n;
  const auto index = [&](int chunk) { return ((chunk % n) + n) % n; };
  // Where the transport takes whole blocks better, each finished chunk goes as one message.
  const bool in_segments = transport.gathers_in_segments();
  const std::size_t segment = in_segments ? segment_elements<Wire>(options) : data.size() + 1;
  // arrivals[step][s]: segment s of the chunk that comes in at gathering step `step`, chunk r - step.
  std::vector<std::vector<WorkPtr>> arrivals(static_cast<std::size_t>(n - 1));
  std::vector<WorkPtr> sends;
  const auto send = [&](std::span<const Wire> part) { sends.push_back(transport.send(next, options.tag, std::as_bytes(part))); };
  const auto post_gathering = [&] {
    for (int step = 0; step + 1 < n; ++step)
      for_each_segment(ring_chunk(wire, n, index(r - step)).size(), segment, [&](std::size_t at, std::size_t length) {
        arrivals[static_cast<std::size_t>(step)].push_back(
            transport.recv(previous, options.tag, bytes_of(ring_chunk(wire, n, index(r - step)).subspan(at, length))));
      });
  };
  // In segments, the reduce-scatter's segments are the gathering's: each goes on as soon as it is summed.
  const auto own = ring_chunk(data, n, index(r + 1));
  const auto own_wire = ring_chunk(wire, n, index(r + 1));
  const auto pass_on_summed = [&](std::size_t at, std::size_t length) {
    narrow<Wire>(own.subspan(at, length), own_wire.subspan(at, length));
    widen<Wire>(own_wire.subspan(at, length), own.subspan(at, length));  // the owner keeps what travels
    if (in_segments) send(own_wire.subspan(at, length));
  };
  ring_reduce_scatter<Wire>(transport, data, wire, options, /*shift=*/0, {.receives_posted = post_gathering, .finished = pass_on_summed});
  if (!in_segments) send(own_wire);
  // One chunk comes in per step, each widened and, but for the last, passed on segment by segment as it arrives.
  for (int step = 0; step + 1 < n; ++step) {
    const auto incoming = ring_chunk(wire, n, index(r - step));
    const auto values = ring_chunk(data, n, index(r - step));
    std::size_t s = 0;
    for_each_segment(incoming.size(), segment, [&](std::size_t at, std::size_t length) {
      arrivals[static_cast<std::size_t>(step)][s++]->wait(transport.timeout());
      widen<Wire>(incoming.subspan(at, length), values.subspan(at, length));
      if (step + 2 < n) send(incoming.subspan(at, length));
    });
  }
  wait_all(sends, transport.timeout());
}

void ring_allreduce(Transport& transport, std::span<float> data, const AllreduceOptions& options) {
  if (transport.size() == 1) {  // no wire, but the same rounding as on a ring: a run's results do not depend on its size
    if (options.wire == DType::BFloat16)
      for (float& v : data) v = round_to(DType::BFloat16, v);
    return;
  }
  if (options.wire != DType::BFloat16) return ring_allreduce<float>(transport, data, data, options);
  // Thread-local, as the receive buffers: a fresh one per call would be faulted in every time.
  thread_local std::vector<std::uint16_t> wire;
  if (wire.size() < data.size()) wire.resize(data.size());
  ring_allreduce<std::uint16_t>(transport, data, std::span(wire).first(data.size()), options);
}

// Recursive doubling (Thakur, Rabenseifner and Gropp 2005): in round k every rank swaps its whole vector
// with the rank 2^k away and adds, so log2(n) message times instead of the ring's 2 (n - 1): the choice
// for small vectors, where latency dominates. With n not a power of two, the first 2 r ranks (r = n - p,
// p the largest power of two below n) fold in pairs first and the odd one of each pair takes part; the
// even one gets the result at the end. Each addition has two operands, and a + b == b + a exactly, so
// all ranks end with bitwise identical results.
template <typename T>
void recursive_doubling_allreduce(Transport& transport, std::span<T> data, const AllreduceOptions& options) {
  const int n = transport.size(), r = transport.rank();
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int folded = n - p;
  thread_local std::vector<T> incoming;
  if (incoming.size() < data.size()) incoming.resize(data.size());
  const auto theirs = std::span(incoming).subspan(0, data.size());
  auto add_theirs = [&] {
    for (std::size_t i = 0; i < data.size(); ++i) data[i] += theirs[i];
  };
  // Ranks below 2 * folded pair up; the odd one of each pair stands for both.
  if (r < 2 * folded && r % 2 == 0) {
    transport.send(r + 1, options.tag, bytes_of(data))->wait(transport.timeout());
    transport.recv(r + 1, options.tag, bytes_of(data))->wait(transport.timeout());
    return;
  }
  if (r < 2 * folded) {
    transport.recv(r - 1, options.tag, bytes_of(theirs))->wait(transport.timeout());
    add_theirs();
  }
  const int self = r < 2 * folded ? r / 2 : r - folded;
  auto real = [&](int virtual_rank) { return virtual_rank < folded ? 2 * virtual_rank + 1 : virtual_rank + folded; };
  for (int mask = 1; mask < p; mask <<= 1) {
    const int partner = real(self ^ mask);
    // The send reads `data` until it completes: the sum is taken after.
    auto sent = transport.send(partner, options.tag, bytes_of(data));
    auto received = transport.recv(partner, options.tag, bytes_of(theirs));
    wait_all({sent, received}, transport.timeout());
    add_theirs();
  }
  if (r < 2 * folded) transport.send(r - 1, options.tag, bytes_of(data))->wait(transport.timeout());
}

// Whether some rank's host has fewer cores than ranks, as the group agreed: each rank knows its own host
// only, and the defaults that follow (segments, where the direct allreduce takes over) must be the same on
// every rank. Agreed once per holder of timings, in one exchange at the first call that needs it, which every
// rank reaches in the same call; nothing without a holder.
std::optional<bool> group_short_of_cores(Transport& transport, const AllreduceOptions& options) {
  if (options.timings == nullptr) return std::nullopt;
  if (const auto agreed = options.timings->short_of_cores()) return agreed;
  std::array<float, 1> short_here{transport.ranks_have_own_cores() ? 0.0f : 1.0f};
  // Around the ring, so that where connections are made on demand it links no ranks the ring does not.
  ring_allreduce(transport, std::span<float>(short_here), {.segment_bytes = kSegmentBytes, .tag = options.tag});
  return options.timings->keep_short_of_cores(short_here[0] > 0);
}

// `options` with their segment size: the caller's, else the finer segments where the group is short of cores
// (kSegmentBytes without timings to keep the group's verdict).
AllreduceOptions with_segments(Transport& transport, const AllreduceOptions& options) {
  AllreduceOptions set = options;
  if (!set.segment_bytes)
    set.segment_bytes = group_short_of_cores(transport, options).value_or(false) ? kSharedCoresSegmentBytes : kSegmentBytes;
  return set;
}


// Recursive halving and doubling (Rabenseifner; Thakur, Rabenseifner and Gropp 2005), for n a power of two:
// in round k each rank swaps half of its current range with the rank n / 2^(k+1) away and adds the half it
// keeps, so that after log2(n) rounds it holds the complete sum of 1/n of the vector; the ranges then travel
// back in the reverse rounds. Each rank moves 2 (n - 1) / n of the vector, as in the ring, in 2 log2(n)
// message times instead of 2 (n - 1). Every range is summed by one rank and copied, a + b == b + a exactly:
// all ranks end with the same bits.
template <typename T>
void halving_doubling_allreduce(Transport& transport, std::span<T> data, const AllreduceOptions& options) {
  const int n = transport.size(), r = transport.rank();
  const std::size_t segment = segment_elements<T>(options);
  thread_local std::vector<T> incoming;
  if (incoming.size() < data.size() / 2 + 1) incoming.resize(data.size() / 2 + 1);
  struct Round {
    int partner;
    std::span<T> kept, given;
  };
  std::vector<Round> rounds;
  std::span<T> range = data;
  for (int distance = n / 2; distance >= 1; distance /= 2) {
    const std::size_t half = range.size() / 2;
    const bool keeps_lower = (r & distance) == 0;
    const Round round{r ^ distance, keeps_lower ? range.first(half) : range.subspan(half),
                      keeps_lower ? range.subspan(half) : range.first(half)};
    send_and_add<T>(transport, options.tag, segment, round.partner, round.given, round.partner, round.kept, incoming);
    rounds.push_back(round);
    range = round.kept;
  }
  for (auto round = rounds.rbegin(); round != rounds.rend(); ++round)
    pass_on<T>(transport, options.tag, segment, round->partner, round->kept, round->partner, round->given);
}

// On 2 ranks both algorithms send the vector once each way: recursive doubling in one exchange, the ring in
// two of half the vector. Over loopback TCP on 2 cores, three sets of 4-12 alternating runs with the cores
// close (as cohort_allreduce_bench --cores tells): recursive doubling 1.22-1.28x at 1 MiB and 0.97-1.25x at
// 2 MiB (medians per set), 0.95-1.12x at 4 MiB, where the ring stays; level with the cores far apart.
// Through shared memory a whole vector above a ring's size streams through it in pieces (4 MiB on 2 ranks:
// 0.35x the ring), so there the ring takes over at 1 MiB as before (level with recursive doubling at 1-2 MiB).
std::size_t latency_optimal_default(int ranks, std::size_t whole_message_bytes) {
  constexpr std::size_t kTwoRanksWhole = std::size_t{4} << 20;
  if (ranks == 2) return whole_message_bytes >= kTwoRanksWhole ? kTwoRanksWhole : std::size_t{1} << 20;
  return std::has_single_bit(static_cast<unsigned>(ranks)) ? std::size_t{128} << 10 : std::size_t{256} << 10;
}

std::string_view choose_allreduce(std::size_t bytes, int ranks, std::size_t whole_message_bytes, const AllreduceOptions& options) {
  const bool halves = ranks > 2 && std::has_single_bit(static_cast<unsigned>(ranks));
  const std::size_t latency_optimal_below =
      options.latency_optimal_below_bytes.value_or(latency_optimal_default(ranks, whole_message_bytes));
  if (options.wire == DType::BFloat16) return "ring (bfloat16 on the wire)";
  if (ranks > 1 && bytes < latency_optimal_below) return kRecursiveDoubling;
  return halves && bytes < options.halving_doubling_below_bytes.value_or(std::size_t{1} << 20) ? kHalvingDoubling : "ring";
}

void allreduce_by_messages(Transport& transport, std::span<float> values, const AllreduceOptions& options) {
  if (options.wire == DType::BFloat16)
    ring_allreduce(transport, values, with_segments(transport, options));
  else if (const auto algorithm = choose_allreduce(values.size_bytes(), transport.size(), transport.whole_message_bytes(), options);
           algorithm == kRecursiveDoubling)
    recursive_doubling_allreduce(transport, values, options);
  else if (algorithm == kHalvingDoubling)
    halving_doubling_allreduce(transport, values, with_segments(transport, options));
  else
    ring_allreduce(transport, values, with_segments(transport, options));
}

// Whether options.timings chooses this allreduce's algorithm: two ranks that may read each other's memory, a
// timed size, float32 on the wire and neither threshold set by the caller.
bool timed_here(Transport& transport, std::size_t bytes, const AllreduceOptions& options) {
  return options.timings != nullptr && transport.size() == 2 && options.wire == DType::Float32 &&
         !options.direct_from_bytes && !options.latency_optimal_below_bytes && AllreduceTimings::timed(bytes) &&
         transport.peer_memory() != nullptr;
}

std::string describe_band(std::size_t bytes) {
  const std::size_t from = std::bit_floor(bytes) >> 20;
  return fmt::format("{}-{} MiB", from, 2 * from);
}

// A trial of the messages or of the direct allreduce in either pieces, or the one the trials kept. After
// the last trial both ranks add up their best times in one exchange, so that both keep the same one.
void timed_allreduce(Transport& transport, PeerMemory& memory, std::span<float> values, const AllreduceOptions& options) {
  using Algorithm = AllreduceTimings::Algorithm;
  AllreduceTimings& timings = *options.timings;
  const std::size_t bytes = values.size_bytes();
  const auto [algorithm, trial] = timings.next(bytes);
  const auto began = trial ? timings.now() : std::chrono::steady_clock::time_point{};
  const bool direct = algorithm != Algorithm::Messages &&
                      direct_allreduce(transport, memory, values, options.tag,
                                       algorithm == Algorithm::DirectFinePieces ? DirectPieces::Fine : DirectPieces::Default);
  if (!direct) allreduce_by_messages(transport, values, options);
  if (!trial || !timings.record(bytes, began, direct || algorithm == Algorithm::Messages)) return;
  auto per_byte = timings.best_seconds_per_byte(bytes);
  allreduce_by_messages(transport, std::span(per_byte), {.tag = options.tag});
  const Algorithm kept = timings.settle(bytes, per_byte);
  const std::string_view messages = choose_allreduce(bytes, 2, transport.whole_message_bytes(), options);
  const auto rate = [&](Algorithm a) { return 2e-9 / per_byte[static_cast<std::size_t>(a)]; };  // GB/s, both ranks' mean
  const auto piece = [&](DirectPieces pieces) { return binary_size(direct_piece_bytes(transport, pieces)); };
  const std::string kept_name = kept == Algorithm::Messages ? std::string(messages)
                                : fmt::format("{} in {} pieces", kDirect,
                                              piece(kept == Algorithm::Direct ? DirectPieces::Default : DirectPieces::Fine));
  log::info("{}: allreduce of {} with its peer on the host: {} at {:.2f} GB/s, {} at {:.2f} GB/s in {} pieces and "
            "{:.2f} GB/s in {} ones (best trials, over both ranks); keeps {}",
            transport.describe(transport.rank()), describe_band(bytes), messages, rate(Algorithm::Messages), kDirect,
            rate(Algorithm::Direct), piece(DirectPieces::Default), rate(Algorithm::DirectFinePieces), piece(DirectPieces::Fine),
            kept_name);
}

}  // namespace

std::string_view allreduce_algorithm(std::size_t bytes, int ranks, const AllreduceOptions& options) {
  return choose_allreduce(bytes, ranks, std::numeric_limits<std::size_t>::max(), options);
}

std::string_view allreduce_algorithm(Transport& transport, std::size_t bytes, const AllreduceOptions& options) {
  const auto messages = [&] { return choose_allreduce(bytes, transport.size(), transport.whole_message_bytes(), options); };
  if (timed_here(transport, bytes, options)) {
    const auto kept = options.timings->settled(bytes);
    return !kept ? kBeingTimed : *kept == AllreduceTimings::Algorithm::Messages ? messages() : kDirect;
  }
  // Names only: before the group's verdict, this rank's own view stands in for it.
  const auto verdict_so_far = [&]() -> std::optional<bool> {
    if (options.timings == nullptr) return std::nullopt;
    return options.timings->short_of_cores().value_or(!transport.ranks_have_own_cores());
  };
  return direct_memory(transport, bytes, options, verdict_so_far) != nullptr ? kDirect : messages();
}

void allreduce(Transport& transport, std::span<std::byte> data, const AllreduceOptions& options) {
  COHORT_CHECK(options.type == DType::Float32, "allreduce: reduces float32 elements, got {}", dtype_name(options.type));
  COHORT_CHECK(options.wire == DType::Float32 || options.wire == DType::BFloat16,
               "allreduce: carries float32 or bfloat16 on the wire, got {}", dtype_name(options.wire));
  const std::size_t element = element_size(options.type);
  COHORT_CHECK(data.size() % element == 0, "allreduce: {} bytes are not whole elements of {} bytes", data.size(), element);
  const std::span values(reinterpret_cast<float*>(data.data()), data.size() / element);
  if (timed_here(transport, data.size(), options)) {
    timed_allreduce(transport, *transport.peer_memory(), values, options);
  } else if (PeerMemory* memory = direct_memory(transport, data.size(), options,
                                                [&] { return group_short_of_cores(transport, options); });
             memory == nullptr || !direct_allreduce(transport, *memory, values, options.tag)) {
    allreduce_by_messages(transport, values, options);
  }
  if (options.op == ReduceOp::Mean) {
    const float inverse = 1.0f / static_cast<float>(transport.size());
    for (float& v : values) v *= inverse;
  }
}

void reduce_scatter(Transport& transport, std::span<std::byte> data, const AllreduceOptions& options) {
  COHORT_CHECK(options.type == DType::Float32, "reduce_scatter: reduces float32 elements, got {}", dtype_name(options.type));
  COHORT_CHECK(options.wire == DType::Float32, "reduce_scatter: carries float32 as it is, not as {}", dtype_name(options.wire));
  const std::size_t element = element_size(options.type), ranks = static_cast<std::size_t>(transport.size());
  COHORT_CHECK(data.size() % (element * ranks) == 0, "reduce_scatter: {} bytes are not {} equal blocks of {}-byte elements",
               data.size(), ranks, element);
  const std::span values(reinterpret_cast<float*>(data.data()), data.size() / element);
  if (ranks > 1) ring_reduce_scatter<float>(transport, values, values, with_segments(transport, options), /*shift=*/1);
  if (options.op == ReduceOp::Mean) {
    const float inverse = 1.0f / static_cast<float>(ranks);
    for (float& v : ring_chunk(values, transport.size(), transport.rank())) v *= inverse;
  }
}

}  // namespace cohort::comm
