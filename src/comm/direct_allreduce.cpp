#include "direct_allreduce.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "cohort/core/error.hpp"
#include "comm/chunks.hpp"

namespace cohort::comm {
namespace {

// What each rank tells every peer first.
struct Announcement {
  std::uint64_t address = 0;  // of its vector, in its process
  std::uint64_t staging = 0;  // of the buffer its peers write their chunks to
  std::uint64_t bytes = 0;
  std::uint64_t reaches_every_peer = 0;
};

// The markers of the later rounds, checked so that a peer out of step is named rather than misread.
enum class Marker : std::uint64_t { Written = 0x5752495454454E, Final = 0x46494E414C, Done = 0x444F4E45 };

// Below this many bytes each chunk's owner writes it into its peers' staging buffers; from it on the peers
// read it from the owner's vector, a round more but no copy out of staging. Medians of 5 to 8 runs on 2
// cores, reading against staging: 2 ranks 0.93x at 512 KiB, 1.08x at 1 MiB, 1.25x at 2 MiB; 3 ranks 0.8x,
// 1.1x, 1.5x; 4 ranks 1.0x, 1.3x, 1.4x.
constexpr std::size_t kStagedBelowBytes = std::size_t{1} << 20;

// Elements of a chunk summed at a time: the sum and one peer's term stay in the core's caches. 1 MiB pieces
// where each rank has a core; where two share one (and its cache) 256 KiB. Medians of 5-6 alternating runs
// on 2 cores, grouped by the cores' placement (cohort_allreduce_bench --cores): on 2 ranks 1 MiB against
// 256 KiB measured 1.1-1.25x at 8-32 MiB with the cores far apart, level with them close; on 4 ranks
// 256 KiB kept 1.1-1.3x at 4-16 MiB with the cores close, level with them far apart.
// On a Sapphire Rapids Xeon, 2 ranks, 256 KiB pieces led instead (1.1-1.2x at 4-16 MiB): where a caller
// times both (allreduce_timings.hpp) it names the piece.
std::size_t piece_elements(const Transport& transport, DirectPieces pieces) {
  if (pieces == DirectPieces::Fine || !transport.ranks_have_own_cores()) return std::size_t{64} << 10;
  return std::size_t{256} << 10;
}

void add_into(std::span<float> sum, std::span<const float> term) {
  for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += term[i];
}

template <typename T>
std::span<std::byte> writable_bytes_of(T& value) { return std::as_writable_bytes(std::span(&value, 1)); }

// Where the peers write their chunks, kept by the calling thread from call to call (a fresh buffer would be
// faulted in every time): every peer of a call that returned has finished with it.
using Staging = std::shared_ptr<std::vector<float>>;
Staging& staging_of_this_thread() {
  thread_local Staging staging = std::make_shared<std::vector<float>>();
  return staging;
}

// The messages and the staging buffer of one call: kept until the process exits when the call fails, since a
// receive still posted may complete later and a peer may still write.
struct Rounds {
  explicit Rounds(std::size_t ranks, Staging staging) : announcements(ranks), markers(ranks), staging(std::move(staging)) {}
  Announcement own;
  std::vector<Announcement> announcements;
  Marker written_marker = Marker::Written, final_marker = Marker::Final, done_marker = Marker::Done;
  std::vector<Marker> markers;
  Staging staging;
};

bool run_rounds(Transport& transport, PeerMemory& memory, std::span<float> data, Tag tag, DirectPieces pieces, Rounds& rounds) {
  const int n = transport.size(), r = transport.rank();
  const bool staged = data.size_bytes() < kStagedBelowBytes;
  std::vector<float>& staging = *rounds.staging;
  if (staged && staging.size() < data.size()) staging.resize(data.size());
  rounds.own = {reinterpret_cast<std::uintptr_t>(data.data()), reinterpret_cast<std::uintptr_t>(staging.data()), data.size_bytes(),
                memory.can_reach_every_peer() ? 1u : 0u};
  const auto peers = [&](auto&& each) {
    for (int step = 1; step < n; ++step) each((r + step) % n);
  };
  const auto exchange = [&](std::span<const std::byte> mine, auto&& theirs) {
    std::vector<WorkPtr> works;
    peers([&](int peer) {
      works.push_back(transport.recv(peer, tag, theirs(peer)));
      works.push_back(transport.send(peer, tag, mine));
    });
    return works;
  };
  wait_all(exchange(std::as_bytes(std::span(&rounds.own, 1)),
                    [&](int peer) { return writable_bytes_of(rounds.announcements[static_cast<std::size_t>(peer)]); }),
           transport.timeout());
  bool every_rank_reaches = rounds.own.reaches_every_peer != 0;
  peers([&](int peer) {
    const Announcement& theirs = rounds.announcements[static_cast<std::size_t>(peer)];
    if (theirs.bytes != data.size_bytes())
      throw ProtocolError(fmt::format("protocol error: {} entered an allreduce of {} bytes where this rank has {}",
                                      transport.describe(peer), theirs.bytes, data.size_bytes()));
    every_rank_reaches = every_rank_reaches && theirs.reaches_every_peer != 0;
  });
  if (!every_rank_reaches) return false;

  // Step 2: this rank's chunk, summed over the ranks in rank order, into its vector (and, staged, the
  // peers' staging buffers).
  const auto byte_offset = [&](std::span<float> part) { return static_cast<std::uint64_t>(part.data() - data.data()) * sizeof(float); };
  const auto announced = [&](int peer) -> const Announcement& { return rounds.announcements[static_cast<std::size_t>(peer)]; };
  const std::size_t piece = piece_elements(transport, pieces);
  thread_local std::vector<float> scratch;  // read into by this thread alone
  if (scratch.size() < 2 * piece) scratch.resize(2 * piece);
  const auto own = ring_chunk(data, n, r);
  for (std::size_t at = 0; at < own.size(); at += piece) {
    const auto mine = own.subspan(at, std::min(piece, own.size() - at));
    // ((x0 + x1) + x2) + ...: in place on ranks 0 and 1, whose own term is one of the first addition's
    // operands (IEEE addition commutes, NaN payloads aside; only the owner sums, so the ranks agree either
    // way); in scratch on the others.
    const bool in_place = r <= 1;
    const auto sum = in_place ? mine : std::span(scratch).subspan(0, mine.size());
    const auto term = std::span(scratch).subspan(piece, mine.size());
    for (int j = 0; j < n; ++j) {
      if (j == r) {
        if (!in_place) add_into(sum, mine);
      } else if (j == 0 && !in_place) {
        memory.read(j, announced(j).address + byte_offset(mine), std::as_writable_bytes(sum));
      } else {
        memory.read(j, announced(j).address + byte_offset(mine), std::as_writable_bytes(term));
        add_into(sum, term);
      }
    }
    if (!in_place) std::ranges::copy(sum, mine.begin());
    if (staged) peers([&](int peer) { memory.write(peer, announced(peer).staging + byte_offset(mine), std::as_bytes(mine)); });
  }
  const auto check_marker = [&](int peer, Marker expected) {
    const Marker got = rounds.markers[static_cast<std::size_t>(peer)];
    if (got != expected)
      throw ProtocolError(fmt::format("protocol error: {} is out of step in a direct allreduce (marker {:#x} where {:#x} was due)",
                                      transport.describe(peer), static_cast<std::uint64_t>(got), static_cast<std::uint64_t>(expected)));
  };
  const auto markers_from_peers = [&](int peer) { return writable_bytes_of(rounds.markers[static_cast<std::size_t>(peer)]); };
  if (staged) {
    // Every peer has written its chunk here, and read its piece of it from this rank's vector.
    wait_all(exchange(std::as_bytes(std::span(&rounds.written_marker, 1)), markers_from_peers), transport.timeout());
    peers([&](int peer) { check_marker(peer, Marker::Written); });
    peers([&](int owner) {
      const auto chunk = ring_chunk(data, n, owner);
      std::copy_n(staging.begin() + static_cast<std::ptrdiff_t>(chunk.data() - data.data()), chunk.size(), chunk.begin());
    });
    return true;
  }
  // Step 3: the other chunks from their owners' vectors, each once it is final; then a last round: every peer is done.
  auto finals = exchange(std::as_bytes(std::span(&rounds.final_marker, 1)), markers_from_peers);
  peers([&](int owner) {
    // The receive from `owner` sits at 2 * (its step - 1) in `finals`, its send after it.
    finals[2 * static_cast<std::size_t>((owner - r + n) % n - 1)]->wait(transport.timeout());
    check_marker(owner, Marker::Final);
    const auto chunk = ring_chunk(data, n, owner);
    if (!chunk.empty()) memory.read(owner, announced(owner).address + byte_offset(chunk), std::as_writable_bytes(chunk));
  });
  wait_all(finals, transport.timeout());
  wait_all(exchange(std::as_bytes(std::span(&rounds.done_marker, 1)), markers_from_peers), transport.timeout());
  peers([&](int peer) { check_marker(peer, Marker::Done); });
  return true;
}

}  // namespace

std::size_t direct_piece_bytes(const Transport& transport, DirectPieces pieces) {
  return piece_elements(transport, pieces) * sizeof(float);
}

bool direct_allreduce(Transport& transport, PeerMemory& memory, std::span<float> data, Tag tag, DirectPieces pieces) {
  Staging& staging = staging_of_this_thread();
  auto rounds = std::make_shared<Rounds>(static_cast<std::size_t>(transport.size()), staging);
  try {
    return run_rounds(transport, memory, data, tag, pieces, *rounds);
  } catch (...) {
    keep_until_exit(rounds);
    staging = std::make_shared<std::vector<float>>();  // the kept one may still be written
    throw;
  }
}

}  // namespace cohort::comm
