#pragma once
// Allreduce on one host straight from the peers' buffers (PeerMemory), no bytes passing through messages.
//
// Rank r owns chunk r of the vector (ring_chunk's cut). Three rounds of small messages frame two phases:
//   1. every rank tells every peer where its vector is, its size, and whether it can read all of them; one
//      "cannot" anywhere and every rank returns false, having changed nothing, so that another algorithm runs;
//   2. each rank sums its chunk over the ranks in rank order, reading each peer's piece of it into scratch
//      that stays in cache, writes the sum into its own vector, and tells every peer "final";
//   3. each rank reads every other chunk from its owner, once the owner said "final", straight into place,
//      tells every peer "done", and returns once every peer said "done" (none reads its vector any more).
// A rank writes only its own chunk before phase 3, and in phase 3 only chunks whose owners have finished
// reading them, so no read sees a half-written piece. Each rank moves 2 (n - 1) / n of the vector, as in the
// ring, but each byte is copied once and reduced while in cache, in 3 message rounds instead of 2 (n - 1)
// steps; only the owner sums a chunk, so every rank ends with the same bits.
#include <span>

#include "cohort/comm/transport.hpp"

namespace cohort::comm {

// False (data unchanged on every rank) when some rank cannot read its peers' memory.
bool direct_allreduce(Transport& transport, PeerMemory& memory, std::span<float> data, Tag tag);

}  // namespace cohort::comm
