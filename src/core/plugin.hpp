#pragma once
// A part of cohort built as a shared library of its own (the CUDA backend with NCCL, the MPI communicator)
// and loaded when first asked for, so that libcohort itself needs none of their libraries: a CPU-only
// program runs on a machine without CUDA or MPI. A part is looked for next to libcohort, then on the
// loader's path; it hands over a table of entry points whose first members say which cohort built it.
//
//   static const LoadedPlugin cuda = load_plugin({"libcohort_cuda.so", "cohort_cuda_plugin", "the CUDA backend",
//                                                 "cohort-cuda", kCudaPluginLayout, false, not_built});
//   std::string why_not;
//   if (const auto* table = table_of<CudaPlugin>(cuda, why_not)) table->backend(); else throw DeviceError(why_not);
#include <string>

namespace cohort {

// What every plugin's table starts with: the cohort version and the table's layout it was built for.
struct PluginHeader {
  const char* cohort_version;
  int layout;
};

struct LoadedPlugin {
  const PluginHeader* table = nullptr;  // null when the part could not be loaded
  std::string why_not;                  // then: what is missing, naming the files
};

struct PluginSpec {
  const char* file;     // "libcohort_cuda.so"
  const char* entry;    // its extern "C" const PluginHeader* cohort_cuda_plugin()
  const char* what;     // "the CUDA backend", for the reason
  const char* package;  // "cohort-cuda": the Debian package that installs it
  int layout;           // the table's layout this libcohort expects
  bool global;          // its symbols visible to what it loads itself (Open MPI's components need MPI's)
  const char* not_built = nullptr;  // when this build lacks the part: why, and the build option that brings it
};

// Loads the part and takes its table, refusing one of another version or layout. Never throws.
LoadedPlugin load_plugin(const PluginSpec& spec);

// The loaded part's table as its own type `Table`, which begins with its PluginHeader; null with `why_not`
// set when the part was not loaded.
template <class Table>
const Table* table_of(const LoadedPlugin& loaded, std::string& why_not) {
  if (loaded.table == nullptr) why_not = loaded.why_not;
  return reinterpret_cast<const Table*>(loaded.table);
}

}  // namespace cohort
