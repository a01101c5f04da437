#pragma once
// Settings read from the environment. Each COHORT_* variable has documented spellings; any other value is
// refused with InvalidArgument naming the variable and its spellings, so that a typo ("false" for "0")
// never silently changes what a run does. Unset means the default; set but empty is refused like any other
// spelling (as the cluster's settings are), so that `COHORT_GEMM=$UNSET_VARIABLE` is not mistaken for a choice.
//
//   if (switch_setting("COHORT_HIERARCHICAL_ALLREDUCE").value_or(true)) ...
//   check_settings();   // every switch and choice at once, before a program starts its work

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace cohort {

// The spellings of each choice, written once for its reader and for check_settings().
inline constexpr std::string_view kProgressSpellings[] = {"bar", "lines"};              // COHORT_PROGRESS
inline constexpr std::string_view kCommunicatorSpellings[] = {"ring", "mpi"};           // COHORT_COMMUNICATOR
inline constexpr std::string_view kGemmSpellings[] = {"eigen", "openblas", "fastest"};  // COHORT_GEMM
inline constexpr std::string_view kCpuIsaSpellings[] = {"portable", "avx2", "avx512"};  // COHORT_CPU_ISA
inline constexpr std::string_view kBf16KernelsSpellings[] = {"native", "float32"};       // COHORT_BF16_KERNELS

// "0" or "1".
std::optional<bool> switch_setting(const char* name);
// One of `choices`.
std::optional<std::string> choice_setting(const char* name, std::span<const std::string_view> choices);
// A whole number >= 0 ("0", "12"); a refusal says what the number is, `meaning`.
std::optional<std::int64_t> count_setting(const char* name, std::string_view meaning);
inline constexpr std::string_view kRestartMeaning =
    "the restart's number, which cohort-launch --restarts sets: 0 is the first run, more resumes from the checkpoint";
inline constexpr std::string_view kCudaDeviceMeaning = "the index of the GPU to use";
inline constexpr std::string_view kEmulatedMemoryMeaning =
    "the emulated device's memory in bytes, beyond which its allocations fail as a GPU's do";

// Checks that every COHORT_* variable in the environment is one of cohort's settings (a misspelt name is
// refused, naming the setting it is nearest to), then the spelling of every switch, choice and count: COHORT_RESTART,
// COHORT_CUDA_DEVICE (whether that GPU exists is checked when the CUDA backend starts), COHORT_EMULATED_MEMORY, COHORT_HIERARCHICAL_ALLREDUCE, COHORT_SHARED_MEMORY, COHORT_SINGLE_COPY, COHORT_TLS, COHORT_ALLOW_TF32, COHORT_DETERMINISTIC, COHORT_PROGRESS,
// COHORT_COMMUNICATOR, COHORT_GEMM, COHORT_CPU_ISA, COHORT_BF16_KERNELS. Whether this build and processor have the GEMM library
// or instruction set named is checked where they are chosen (check_cpu_kernel_settings()).
void check_settings();

}  // namespace cohort
