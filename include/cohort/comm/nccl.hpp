#pragma once
// The NCCL communicator: allreduce, broadcast and allgather of buffers on the GPU, when every rank drives
// a GPU of its own. Made collectively over a host communicator (the ring over cohort's authenticated
// transport, or MPI): the ranks first exchange which GPU each uses, and only when every rank has one and
// no two share it does rank 0 create NCCL's unique id and broadcast it over that communicator. Otherwise
// every rank gets null and the same reason, and gradients go through pinned host buffers and the host
// communicator. Each collective runs on NCCL's own stream and is watched: an error NCCL reports, or a
// collective still running after the host communicator's timeout (a peer that died), aborts the NCCL
// communicator and fails the Work with a reason instead of hanging.
//
//   std::string why_not;
//   auto nccl = comm::make_nccl_communicator(*ring, cuda_device_index(), why_not);   // on every rank

#include <memory>
#include <string>

#include "cohort/comm/communicator.hpp"

namespace cohort::comm {

// Whether this build has the NCCL communicator. Its part, libcohort_nccl.so, is loaded by
// make_nccl_communicator on a rank that trains on a GPU; a rank that cannot load it says so to the others.
bool nccl_available();
// Collective: every rank of `bootstrap` calls it with the CUDA ordinal of the GPU its buffers live on, or
// -1 when they are not on a GPU. Returns NCCL, or null with `why_not` set (the same on every rank).
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int gpu, std::string& why_not);

}  // namespace cohort::comm
