#pragma once
// Collectives written once above the Transport interface, so that every transport gets them. All are
// blocking, must be called by every rank of the group in the same order, and fail (never hang) when a
// peer is lost or a wait passes the transport's deadline. Concurrent collectives need distinct tags;
// successive ones may reuse a tag.
//
//   comm::allreduce(transport, gradients, {.op = comm::ReduceOp::Mean});
//   comm::broadcast(transport, /*root=*/0, std::as_writable_bytes(std::span(weights)));
// The element type is an option of the reductions (gloo's AllreduceOptions), so that 16-bit gradients
// need no second code path; the wire carries the elements as they are.

#include <cstddef>
#include <optional>
#include <span>
#include <string_view>

#include "cohort/comm/transport.hpp"
#include "cohort/core/dtype.hpp"

namespace cohort::comm {

inline constexpr Tag kCollectiveTag = 0xC011EC7100000000ull;

enum class ReduceOp { Sum, Mean };

class AllreduceTimings;  // allreduce_timings.hpp

struct AllreduceOptions {
  ReduceOp op = ReduceOp::Sum;
  // The elements' type (cohort's one DType); reductions add float32, other types are refused by name.
  DType type = DType::Float32;
  // Their type on the wire: bfloat16 halves the bytes of float32 data. Every addition is still float32;
  // what leaves a rank is rounded to bfloat16, and the finished sums are rounded once and kept, so that every
  // rank ends with the same bits. The ring always carries it (recursive doubling would leave the ranks apart).
  DType wire = DType::Float32;
  // The ring moves its chunks in segments of this size, as a pipeline: reducing one segment overlaps
  // receiving the next, and each summed segment goes on at once; finished chunks too, where the transport
  // gathers in segments (TCP). Recursive halving and doubling moves its halves so. Set on every rank alike,
  // as every option. Unset: 256 KiB, or 128 KiB where the group agreed (through `timings`) that some rank's
  // host has fewer cores than ranks (collectives.cpp says what was measured).
  std::optional<std::size_t> segment_bytes{};
  // Below this size the latency-optimal recursive doubling (log2 n exchanges of the whole vector) runs
  // instead of the ring (2 (n - 1) exchanges of 1/n of it). Unset: where it stopped beating the others in
  // the allreduce sweep over loopback TCP on 2 cores, 4 MiB on 2 ranks (both send the vector once, the ring
  // in two exchanges of half of it), 1 MiB there where the transport streams messages above a few MiB
  // through in pieces (shared memory; Transport::whole_message_bytes), 128 KiB on 4, 8, ... ranks and 256 KiB
  // on the rest.
  std::optional<std::size_t> latency_optimal_below_bytes{};
  // From there up to this size, on a power-of-two group above 2 ranks, recursive halving and doubling (the
  // ring's bytes in 2 log2 n exchanges instead of 2 (n - 1)) runs instead of the ring. Unset: 1 MiB, where
  // the ring overtook it on 4 ranks (256-512 KiB: 1.5-1.7 GB/s against the ring's 0.9-1.2; 1-2 MiB: 1.1-1.4
  // against 1.4-1.7).
  std::optional<std::size_t> halving_doubling_below_bytes{};
  // From this size, where the transport can read every peer's memory (shared memory, all ranks on one host),
  // each rank reduces its chunk straight from its peers' vectors and then reads the finished chunks from
  // their owners: one copy per byte and three rounds of small messages (direct_allreduce.hpp). Unset: 8 MiB on
  // 2 ranks (from 1 to 64 MiB timed instead where `timings` is given), and on more 128 KiB where the group
  // agreed (through `timings`) that each rank has a core of its own, else 512 KiB (default_direct_from() in
  // collectives.cpp says what was measured).
  std::optional<std::size_t> direct_from_bytes{};
  // Where given, two ranks that read each other's memory choose between the messages and the direct
  // allreduce by timing both at each power-of-two size from 1 MiB to 64 MiB (allreduce_timings.hpp), unless
  // latency_optimal_below_bytes or direct_from_bytes is set (on every rank alike, as every option); and the
  // group agrees once whether some host is short of cores, which the defaults above follow. Held by the
  // caller across calls, as a communicator does, for one group, and dropped with it after a failed collective.
  AllreduceTimings* timings = nullptr;
  Tag tag = kCollectiveTag;
};

// Returns once every rank has entered the barrier. Dissemination: ceil(log2 n) rounds of one byte.
void barrier(Transport& transport, Tag tag = kCollectiveTag);
// Copies root's `data` into every rank's `data` (same size everywhere) along a binomial tree.
void broadcast(Transport& transport, int root, std::span<std::byte> data, Tag tag = kCollectiveTag);
// all = the `mine` of rank 0, then rank 1, ...; all.size() must be size() * mine.size(). `mine` may be
// this rank's block of `all` (in place).
void allgather(Transport& transport, std::span<const std::byte> mine, std::span<std::byte> all, Tag tag = kCollectiveTag);
// Element-wise sum (or mean) of `data` across ranks, in place; every rank ends with identical values.
// `data` holds elements of options.type.
void allreduce(Transport& transport, std::span<std::byte> data, const AllreduceOptions& options = {});
// Reduce-scatter: `data` holds size() equal blocks; afterwards block r of rank r holds the sum (or mean) of
// every rank's block r, in place, and the other blocks hold partial sums. The first half of the ring
// allreduce: each rank sends and receives (n - 1) / n of the vector. Float32 on the wire only.
void reduce_scatter(Transport& transport, std::span<std::byte> data, const AllreduceOptions& options = {});
// Which algorithm allreduce() runs for `bytes` on `ranks` ranks without peer memory, over a transport that
// moves messages whole (TCP): "ring", "recursive doubling", or "ring (bfloat16 on the wire)".
std::string_view allreduce_algorithm(std::size_t bytes, int ranks, const AllreduceOptions& options = {});
// As above, on `transport`: "direct (from the peers' memory)" where it reads its peers' memory (which
// falls back to the others when some rank cannot), and "timed (messages or direct)" while
// options.timings has yet to choose between them for this size (also for calls queued before the choice
// that run after it).
std::string_view allreduce_algorithm(Transport& transport, std::size_t bytes, const AllreduceOptions& options = {});
inline void allreduce(Transport& transport, std::span<float> data, const AllreduceOptions& options = {}) {
  allreduce(transport, std::as_writable_bytes(data), options);
}

// Hierarchical allreduce (Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE) for ranks spread over hosts:
// host_of[r] is rank r's host. The ranks of each host send their vectors to the host's first rank, which
// adds them in rank order; those first ranks allreduce among themselves (allreduce() above); each then
// broadcasts the result within its host. Only one rank per host sends across hosts, and every rank ends
// with the same bits.
void hierarchical_allreduce(Transport& transport, std::span<const int> host_of, std::span<std::byte> data,
                            const AllreduceOptions& options = {});
// Whether `host_of` makes a hierarchy worth having: more than one host, and a host with several ranks.
bool spans_hosts_with_several_ranks(std::span<const int> host_of);

}  // namespace cohort::comm
