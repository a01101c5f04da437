#pragma once
// The implementations behind cpu::gemm, with its contract (cpu_backend.hpp) for m, n, k > 0;
// gemm_path.cpp chooses among them.
#include <cstdint>

#include "cohort/core/config.hpp"

namespace cohort::cpu {

void eigen_gemm(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                std::int64_t ldc);

#if COHORT_HAS_OPENBLAS
// OpenBLAS's OpenMP build: multithreaded over cohort's thread budget, single-threaded inside a parallel
// region. Its integers are 32-bit: larger products go to Eigen instead.
void openblas_gemm(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                   const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                   std::int64_t ldc);
#endif

}  // namespace cohort::cpu
