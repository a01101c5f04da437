// The MPI communicator's part, libcohort_mpi.so, loaded when a job first asks for MPI.
#include "cohort/comm/mpi.hpp"

#include "cohort/core/config.hpp"
#include "cohort/core/error.hpp"
#include "mpi_plugin.hpp"

namespace cohort::comm {
namespace {

const MpiPlugin* mpi_plugin(std::string& why_not) {
  // Global: Open MPI loads components of its own that look for its symbols.
  static const LoadedPlugin loaded =
      load_plugin({"libcohort_mpi.so", "cohort_mpi_plugin", "the MPI communicator", "cohort-mpi", kMpiPluginLayout, true,
                   COHORT_HAS_MPI ? nullptr
                                  : "this build of cohort has no MPI communicator: install Open MPI (Debian: "
                                    "libopenmpi-dev) and configure with -DCOHORT_WITH_MPI=ON"});
  return table_of<MpiPlugin>(loaded, why_not);
}

}  // namespace

bool mpi_available() {
  std::string why_not;
  return mpi_plugin(why_not) != nullptr;
}

std::shared_ptr<Communicator> make_mpi_communicator(MpiOptions options) {
  std::string why_not;
  if (const MpiPlugin* plugin = mpi_plugin(why_not)) return plugin->make_communicator(options);
  throw InvalidArgument(why_not);
}

}  // namespace cohort::comm
