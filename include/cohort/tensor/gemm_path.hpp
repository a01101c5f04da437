#pragma once
// The library that computes the CPU backend's matrix products (Dense, the convolutions' GEMMs): Eigen
// unless COHORT_GEMM or set_gemm_path() chooses, so that a job repeats bit for bit whatever the machine's
// load (Eigen and OpenBLAS round differently). COHORT_GEMM=openblas chooses OpenBLAS where this build has
// it; COHORT_GEMM=fastest measures both for a few milliseconds on the first product and keeps the faster,
// which a run that measures again may see otherwise.
//
//   fmt::print("matrix products: {}\n", gemm_path_name(gemm_path()));

#include <optional>
#include <string_view>
#include <vector>

namespace cohort {

enum class GemmPath { Eigen, OpenBlas };

// "eigen" or "openblas".
std::string_view gemm_path_name(GemmPath path);
// The path of that name which this build has; nothing for another name or a path this build lacks.
std::optional<GemmPath> gemm_path_named(std::string_view name);
// Whether COHORT_GEMM names a path, rather than leaving the choice to the default or a measurement.
bool gemm_path_named_by_setting();
// The paths this build has: Eigen always, OpenBLAS when it was found at configure time.
std::vector<GemmPath> available_gemm_paths();
// The path in use (chosen on the first call). InvalidArgument when COHORT_GEMM names another path or one
// this build lacks.
GemmPath gemm_path();
// Uses `path` from now on, for every thread. InvalidArgument when this build lacks it.
void set_gemm_path(GemmPath path);
// The instruction set of the CPU backend's own kernels (the Winograd and direct convolutions): "portable",
// "avx2" or "avx512". They round differently, so a resumed run takes the set the interrupted one used.
std::string_view cpu_isa_name();
// Whether COHORT_CPU_ISA names the set, rather than leaving it to the best this processor runs.
bool cpu_isa_named_by_setting();
// Runs the set of that name from now on, and says true, when this build and processor have it.
bool use_cpu_isa_named(std::string_view name);
// COHORT_GEMM and COHORT_CPU_ISA against this build and processor, at once rather than at the first
// product or convolution: InvalidArgument naming the variable and what this machine has.
void check_cpu_kernel_settings();

}  // namespace cohort
