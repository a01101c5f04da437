// Loads the CUDA backend's part, libcohort_cuda.so, the first time a CUDA device is asked for.
#include "tensor/cuda/cuda_plugin.hpp"

#include <atomic>

#include "cohort/core/config.hpp"

namespace cohort::cuda {
namespace {
std::atomic<const CudaPlugin*> loaded_table{nullptr};
}

const CudaPlugin* cuda_plugin(std::string& why_not) {
  static const LoadedPlugin loaded = [] {
    LoadedPlugin plugin = load_plugin({"libcohort_cuda.so", "cohort_cuda_plugin", "the CUDA backend", "cohort-cuda",
                                       kCudaPluginLayout, false,
                                       COHORT_HAS_CUDA ? nullptr
                                                       : "this build of cohort has no cuda backend: configure with "
                                                         "-DCOHORT_WITH_CUDA=ON on a machine with the CUDA toolkit, cuDNN and cuBLAS"});
    loaded_table.store(reinterpret_cast<const CudaPlugin*>(plugin.table));  // the table begins with its header
    return plugin;
  }();
  return table_of<CudaPlugin>(loaded, why_not);
}

const CudaPlugin* cuda_plugin_if_loaded() { return loaded_table.load(); }

}  // namespace cohort::cuda
