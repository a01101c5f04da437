#pragma once
// Shared memory between ranks on one host. connect_group() connects the ranks over TCP (authenticated,
// with heartbeats) exactly as connect_tcp() does; then each pair of ranks on the same host moves its
// messages through lock-free rings in shared memory instead of loopback TCP, with futex wake-ups.
//
// - The same host: equal `hosts` labels, by default the host part of each rank's address.
// - On demand: a pair sets up its rings (and reserves their memory) when it first talks, so that a job
//   holds the pairs its pattern uses; the first send or receive of a pair waits for that (a round trip).
// - A segment's name is sent only over the authenticated TCP link, so no rank maps memory before the
//   shared secret is proven. Segments are memory files sealed against shrinking (a peer maps only a sealed
//   one, so nobody can make it die of SIGBUS), opened by processes of the same user only, and gone with
//   their last user.
// - A pair whose segments cannot be opened or reserved (another user's process, not enough memory) keeps
//   TCP, with a warning naming the peer.
// - A peer's counters are checked before every copy: values it could not have written in good faith fail
//   every operation with ProtocolError, naming it.
// - Single copy: a message of at least `single_copy_bytes` is read by its receiver straight from the
//   sender's memory (Linux cross-memory attach, as Open MPI's shared-memory transport does) instead of
//   being copied into a ring and out again; a pair whose kernel refuses that (kernel.yama.ptrace_scope
//   above 0) keeps the rings, with one warning naming the reason. The same reads let a large allreduce on one
//   host reduce straight from the peers' vectors (AllreduceOptions::direct_from_bytes).
// - Loss detection stays with the TCP link: a peer whose process dies, stops or says goodbye is noticed
//   through its socket and heartbeats, and every pending operation fails naming it.
//
//   auto transport = comm::connect_group(options);   // GroupOptions, as for connect_tcp

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "cohort/comm/tcp.hpp"

namespace cohort::comm {

struct SharedMemoryOptions {
  // A label per rank; ranks with equal labels share memory. Empty: the host of each rank's address.
  std::vector<std::string> hosts;
  // Each direction of each pair has a ring of this size at most; larger messages stream through it.
  std::size_t ring_bytes = std::size_t{2} << 20;
  // The most one process reserves for its same-host peers' rings: with more peers than fit at ring_bytes
  // each ring gets an equal share (64 KiB at least, or ring_bytes when smaller), so that 128 ranks on one
  // host reserve 8 GiB in all rather than 32. A host whose ranks would reserve more than half of its
  // available memory (MemAvailable, or its cgroup's limit) keeps TCP for them, with one warning each.
  std::size_t mailbox_bytes = std::size_t{64} << 20;
  // Messages this large or larger take one copy, read from the sender's memory; 0 (or
  // GroupOptions::single_copy false) keeps every message in the rings, and the allreduce off the peers' memory.
  // (The allreduce reads its peers' vectors from its own threshold, AllreduceOptions::direct_from_bytes: there
  // each byte is copied once in place of a ring's two, and reduced while in cache.) Below that, measured on 2 cores, two copies cost less: they overlap, one on each process's core,
  // and the kernel's cross-process copy runs slower than memcpy on data in cache (8 MiB is above it).
  std::size_t single_copy_bytes = std::size_t{8} << 20;
};

// Connects like connect_tcp(); peers on this rank's host then talk through shared memory. The transport
// "shared-memory" (transports.hpp), a Cluster's unless it is given another. Throws InvalidArgument for `hosts` of the wrong length, rings
// under 4 KiB or over 1 GiB, or a mailbox smaller than one ring.
std::unique_ptr<Transport> connect_group(const GroupOptions& options, const SharedMemoryOptions& shared_memory = {});

// The size of each ring in the mailbox of a process with `peers` same-host peers (see mailbox_bytes).
std::size_t ring_bytes_for(const SharedMemoryOptions& shared_memory, std::size_t peers);

}  // namespace cohort::comm
