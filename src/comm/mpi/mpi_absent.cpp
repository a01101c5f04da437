// This build has no MPI: asking for the MPI communicator names the option that brings it.
#include "cohort/comm/mpi.hpp"
#include "cohort/core/error.hpp"

namespace cohort::comm {

bool mpi_available() { return false; }

std::shared_ptr<Communicator> make_mpi_communicator(MpiOptions) {
  throw InvalidArgument("this build of cohort has no MPI communicator: install Open MPI (Debian: libopenmpi-dev) "
                        "and configure with -DCOHORT_WITH_MPI=ON");
}

}  // namespace cohort::comm
