// The MPI communicator's part, libcohort_mpi.so, loaded when a job first asks for MPI.
#include "cohort/comm/mpi.hpp"

#include "cohort/core/config.hpp"
#include "cohort/core/error.hpp"
#include "mpi_plugin.hpp"

namespace cohort::comm {
namespace {

const MpiPlugin* mpi_plugin(std::string& why_not) {
  static const LoadedPlugin loaded = [] {
    if (!COHORT_HAS_MPI)
      return LoadedPlugin{nullptr, "this build of cohort has no MPI communicator: install Open MPI (Debian: "
                                   "libopenmpi-dev) and configure with -DCOHORT_WITH_MPI=ON"};
    // Global: Open MPI loads components of its own that look for its symbols.
    return load_plugin({"libcohort_mpi.so", "cohort_mpi_plugin", "the MPI communicator", "cohort-mpi", kMpiPluginLayout, true});
  }();
  if (loaded.table == nullptr) why_not = loaded.why_not;
  return reinterpret_cast<const MpiPlugin*>(loaded.table);  // the table begins with its header
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
