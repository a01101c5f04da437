// The single translation unit that instantiates Eigen's GEMM, one of the paths behind cpu::gemm
// (gemm_path.cpp). Eigen spreads a product over the OpenMP thread budget, and runs it on the calling
// thread alone when called inside a parallel region.
#include <Eigen/Core>

#include "gemm_paths.hpp"

namespace cohort::cpu {
namespace {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMajor, Eigen::Unaligned, Eigen::OuterStride<>>;
using Map = Eigen::Map<RowMajor, Eigen::Unaligned, Eigen::OuterStride<>>;

template <typename A, typename B>
void product_into(Map& c, float alpha, const A& a, const B& b, float beta) {
  if (beta == 0.0f) {
    c.noalias() = alpha * a * b;
  } else {
    if (beta != 1.0f) c *= beta;
    c.noalias() += alpha * a * b;
  }
}

}  // namespace

void eigen_gemm(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                std::int64_t ldc) {
  Map cm(c, m, n, Eigen::OuterStride<>(ldc));
  ConstMap am(a, transpose_a ? k : m, transpose_a ? m : k, Eigen::OuterStride<>(lda));
  ConstMap bm(b, transpose_b ? n : k, transpose_b ? k : n, Eigen::OuterStride<>(ldb));
  if (!transpose_a && !transpose_b) product_into(cm, alpha, am, bm, beta);
  else if (transpose_a && !transpose_b) product_into(cm, alpha, am.transpose(), bm, beta);
  else if (!transpose_a && transpose_b) product_into(cm, alpha, am, bm.transpose(), beta);
  else product_into(cm, alpha, am.transpose(), bm.transpose(), beta);
}

}  // namespace cohort::cpu
