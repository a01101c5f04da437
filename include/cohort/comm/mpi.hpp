#pragma once
// The Open MPI communicator: collectives through MPI_Allreduce, MPI_Bcast and MPI_Allgather, so that a
// cluster's own fabric (InfiniBand, RDMA, shared memory between ranks on one host) carries the gradients.
// Built when Open MPI is found at configure time (-DCOHORT_WITH_MPI=ON, Debian's libopenmpi-dev); used
// when the job runs under mpirun and asks for it (COHORT_COMMUNICATOR=mpi, see train::strategy_for).
// Its rank and size are MPI_COMM_WORLD's. MPI is initialized on first use and finalized when the last
// communicator goes away; every MPI call is made from the communicator's own thread. MPI cannot cancel a
// collective: if one never returns (a rank stopped joining) and MPI cannot finalize within the timeout,
// the communicator asks mpirun to end the job (MPI_Abort) rather than hang the process.
//
//   auto communicator = comm::make_mpi_communicator();
//   Trainer trainer(model, optim::Adam(), std::make_shared<train::RingAllreduce>(std::move(communicator)));

#include <chrono>
#include <memory>

#include "cohort/comm/communicator.hpp"

namespace cohort::comm {

struct MpiOptions {
  // How long a caller waits for one collective before declaring the group stuck.
  std::chrono::milliseconds timeout{60000};
};

// Whether the MPI communicator can be used here: this build has it and its part, libcohort_mpi.so, loads.
bool mpi_available();
// Throws InvalidArgument naming the build option when this build has no MPI, or what is missing when its
// part cannot be loaded.
std::shared_ptr<Communicator> make_mpi_communicator(MpiOptions options = {});

}  // namespace cohort::comm
