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
  std::uint64_t bytes = 0;
  std::uint64_t reads_every_peer = 0;
};

// The markers of phases 2 and 3, checked so that a peer out of step is named rather than misread.
enum class Marker : std::uint64_t { Final = 0x46494E414C, Done = 0x444F4E45 };

// Pieces of a chunk summed at a time: the sum and one peer's term stay in the core's cache.
constexpr std::size_t kPieceElements = std::size_t{64} << 10;

void add_into(std::span<float> sum, std::span<const float> term) {
  for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += term[i];
}

template <typename T>
std::span<std::byte> writable_bytes_of(T& value) { return std::as_writable_bytes(std::span(&value, 1)); }

// The messages of one call: kept until the process exits when the call fails, since a receive still
// posted may complete later.
struct Rounds {
  explicit Rounds(std::size_t ranks) : announcements(ranks), finals(ranks), dones(ranks) {}
  Announcement own;
  std::vector<Announcement> announcements;
  Marker final_marker = Marker::Final, done_marker = Marker::Done;
  std::vector<Marker> finals, dones;
};

bool run_rounds(Transport& transport, PeerMemory& memory, std::span<float> data, Tag tag, Rounds& rounds) {
  const int n = transport.size(), r = transport.rank();
  rounds.own = {reinterpret_cast<std::uintptr_t>(data.data()), data.size_bytes(), memory.can_read_every_peer() ? 1u : 0u};
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
  bool every_rank_reads = rounds.own.reads_every_peer != 0;
  peers([&](int peer) {
    const Announcement& theirs = rounds.announcements[static_cast<std::size_t>(peer)];
    if (theirs.bytes != data.size_bytes())
      throw ProtocolError(fmt::format("protocol error: {} entered an allreduce of {} bytes where this rank has {}",
                                      transport.describe(peer), theirs.bytes, data.size_bytes()));
    every_rank_reads = every_rank_reads && theirs.reads_every_peer != 0;
  });
  if (!every_rank_reads) return false;

  // Phase 2: this rank's chunk, summed over the ranks in rank order.
  const auto byte_offset = [&](std::span<float> part) { return static_cast<std::uint64_t>(part.data() - data.data()) * sizeof(float); };
  const auto read_part = [&](int peer, std::span<float> part, std::span<float> into) {
    memory.read(peer, rounds.announcements[static_cast<std::size_t>(peer)].address + byte_offset(part), std::as_writable_bytes(into));
  };
  thread_local std::vector<float> scratch(2 * kPieceElements);  // read into by this thread alone
  const auto own = ring_chunk(data, n, r);
  for (std::size_t at = 0; at < own.size(); at += kPieceElements) {
    const auto mine = own.subspan(at, std::min(kPieceElements, own.size() - at));
    // ((x0 + x1) + x2) + ...: in place on ranks 0 and 1, whose own term is one of the first addition's
    // operands (IEEE addition commutes, NaN payloads aside; only the owner sums, so the ranks agree either
    // way); in scratch on the others.
    const bool in_place = r <= 1;
    const auto sum = in_place ? mine : std::span(scratch).subspan(0, mine.size());
    const auto term = std::span(scratch).subspan(kPieceElements, mine.size());
    for (int j = 0; j < n; ++j) {
      if (j == r) {
        if (!in_place) add_into(sum, mine);
      } else if (j == 0 && !in_place) {
        read_part(j, mine, sum);
      } else {
        read_part(j, mine, term);
        add_into(sum, term);
      }
    }
    if (!in_place) std::ranges::copy(sum, mine.begin());
  }

  // Phase 3: the other chunks from their owners, each once it is final.
  auto finals = exchange(std::as_bytes(std::span(&rounds.final_marker, 1)),
                         [&](int peer) { return writable_bytes_of(rounds.finals[static_cast<std::size_t>(peer)]); });
  const auto check_marker = [&](int peer, Marker got, Marker expected) {
    if (got != expected)
      throw ProtocolError(fmt::format("protocol error: {} is out of step in a direct allreduce (marker {:#x} where {:#x} was due)",
                                      transport.describe(peer), static_cast<std::uint64_t>(got), static_cast<std::uint64_t>(expected)));
  };
  peers([&](int owner) {
    // The receive from `owner` sits at 2 * (its step - 1) in `finals`, its send after it.
    finals[2 * static_cast<std::size_t>((owner - r + n) % n - 1)]->wait(transport.timeout());
    check_marker(owner, rounds.finals[static_cast<std::size_t>(owner)], Marker::Final);
    const auto chunk = ring_chunk(data, n, owner);
    if (!chunk.empty()) read_part(owner, chunk, chunk);
  });
  wait_all(finals, transport.timeout());
  wait_all(exchange(std::as_bytes(std::span(&rounds.done_marker, 1)),
                    [&](int peer) { return writable_bytes_of(rounds.dones[static_cast<std::size_t>(peer)]); }),
           transport.timeout());
  peers([&](int peer) { check_marker(peer, rounds.dones[static_cast<std::size_t>(peer)], Marker::Done); });
  return true;
}

}  // namespace

bool direct_allreduce(Transport& transport, PeerMemory& memory, std::span<float> data, Tag tag) {
  auto rounds = std::make_shared<Rounds>(static_cast<std::size_t>(transport.size()));
  try {
    return run_rounds(transport, memory, data, tag, *rounds);
  } catch (...) {
    keep_until_exit(rounds);
    throw;
  }
}

}  // namespace cohort::comm
