#pragma once
// The MPI communicator lives in libcohort_mpi.so (core/plugin.hpp), so that libcohort needs no MPI
// library: its table of entry points.
#include <memory>

#include "cohort/comm/mpi.hpp"
#include "core/plugin.hpp"

namespace cohort::comm {

inline constexpr int kMpiPluginLayout = 3;  // 2: Communicator::reduce_scatter; 3: Buffer::ready

struct MpiPlugin {
  PluginHeader header;
  // comm/mpi.hpp's make_mpi_communicator.
  std::shared_ptr<Communicator> (*make_communicator)(MpiOptions options);
};

}  // namespace cohort::comm
