// cpu::gemm through OpenBLAS's CBLAS interface.
#include <cblas.h>

#include <limits>

#include "gemm_paths.hpp"

namespace cohort::cpu {

void openblas_gemm(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                   const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                   std::int64_t ldc) {
  constexpr std::int64_t kLargest = std::numeric_limits<blasint>::max();
  if (m > kLargest || n > kLargest || k > kLargest || lda > kLargest || ldb > kLargest || ldc > kLargest)
    return eigen_gemm(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

}  // namespace cohort::cpu
