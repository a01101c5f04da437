#pragma once
// Allreduce on one host straight between the peers' memory (PeerMemory), no bytes passing through messages.
//
// Rank r owns chunk r of the vector (ring_chunk's cut). Rounds of small messages frame the work:
//   1. every rank tells every peer where its vector is, where its staging buffer is (owned by cohort), the
//      vector's size, and whether it can reach all of them; one "cannot" anywhere and every rank returns
//      false, having changed nothing, so that another algorithm runs;
//   2. each rank sums its chunk over the ranks in rank order, reading each peer's piece of it into scratch
//      that stays in cache, and writes the sum into its own vector. Then, below 1 MiB (staged), it also
//      writes the sum into every peer's staging buffer and tells every peer "written"; once every peer
//      said so, it copies the other chunks from its staging buffer into its vector and returns. From 1 MiB
//      it tells every peer "final" instead, and
//   3. reads every other chunk from its owner's vector once the owner said "final", tells every peer "done",
//      and returns once every peer said "done".
// A rank's vector is read by its peers only in their own chunks, which it leaves alone until they said
// "written" or "final"; its staging buffer is written only by the chunks' owners, and read by it only after.
// When a rank returns, no peer reads or writes its memory any more; a call that fails keeps its staging
// buffer until the process exits, since a peer may still write to it (never the vector: a peer writes only
// memory that cohort owns). Each rank moves 2 (n - 1) / n of the vector between processes, as in the ring,
// each byte reduced while in cache, in 2 or 3 message rounds instead of 2 (n - 1) steps; only the owner sums
// a chunk, so every rank ends with the same bits.
#include <span>

#include "cohort/comm/transport.hpp"

namespace cohort::comm {

// The pieces in which a rank reads and sums its chunk: 1 MiB where each rank has a core of its own and
// 256 KiB where they share (Default), or 256 KiB (Fine). A rank's choice changes neither the sums nor what
// its peers see.
enum class DirectPieces { Default, Fine };
std::size_t direct_piece_bytes(const Transport& transport, DirectPieces pieces);

// False (data unchanged on every rank) when some rank cannot reach its peers' memory.
bool direct_allreduce(Transport& transport, PeerMemory& memory, std::span<float> data, Tag tag,
                      DirectPieces pieces = DirectPieces::Default);

}  // namespace cohort::comm
