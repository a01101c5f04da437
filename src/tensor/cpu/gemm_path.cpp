// cpu::gemm and the choice of its path: Eigen unless COHORT_GEMM or set_gemm_path() chose. Under
// COHORT_GEMM=fastest the first product times every available path on the kinds of products the layers
// make (a Winograd position's product, an im2col convolution, a kernel and a data gradient, a Dense layer)
// and keeps the fastest; another path must be 5 % faster than Eigen to replace it, so that noise never
// makes a machine slower.
#include "cohort/tensor/gemm_path.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <string>

#include "cohort/core/check.hpp"
#include "cohort/core/logging.hpp"
#include "cpu_backend.hpp"
#include "gemm_paths.hpp"
#include "onednn.hpp"
#include "winograd.hpp"

namespace cohort {
namespace {

constexpr int kUnchosen = -1;
std::atomic<int> chosen{kUnchosen};
std::once_flag first_choice;

struct Product {
  bool transpose_a, transpose_b;
  std::int64_t m, n, k;
};
constexpr Product kTypicalProducts[] = {
    {false, false, 256, 64, 64}, {false, false, 1024, 32, 27}, {true, false, 288, 64, 512}, {false, true, 512, 288, 64},
    {false, false, 128, 512, 512}};

void run(GemmPath path, const Product& p, const float* a, const float* b, float* c) {
  const std::int64_t lda = p.transpose_a ? p.m : p.k, ldb = p.transpose_b ? p.k : p.n;
#if COHORT_HAS_OPENBLAS
  if (path == GemmPath::OpenBlas) return cpu::openblas_gemm(p.transpose_a, p.transpose_b, p.m, p.n, p.k, 1.0f, a, lda, b, ldb, 0.0f, c, p.n);
#endif
  (void)path;
  cpu::eigen_gemm(p.transpose_a, p.transpose_b, p.m, p.n, p.k, 1.0f, a, lda, b, ldb, 0.0f, c, p.n);
}

// The best of three runs of every typical product, summed: a few milliseconds.
double seconds_for_typical_products(GemmPath path) {
  double total = 0.0;
  for (const Product& p : kTypicalProducts) {
    const std::vector<float> a(static_cast<std::size_t>(p.m * p.k), 0.5f), b(static_cast<std::size_t>(p.k * p.n), 0.25f);
    std::vector<float> c(static_cast<std::size_t>(p.m * p.n));
    run(path, p, a.data(), b.data(), c.data());  // warm caches and the library's threads
    double best = std::numeric_limits<double>::infinity();
    for (int repeat = 0; repeat < 3; ++repeat) {
      const auto start = std::chrono::steady_clock::now();
      run(path, p, a.data(), b.data(), c.data());
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    total += best;
  }
  return total;
}

GemmPath measured_fastest() {
  const std::vector<GemmPath> paths = available_gemm_paths();
  if (paths.size() == 1) return paths.front();
  const double eigen_seconds = seconds_for_typical_products(GemmPath::Eigen);
  GemmPath best = GemmPath::Eigen;
  double best_seconds = eigen_seconds * 0.95;
  for (GemmPath path : paths) {
    if (path == GemmPath::Eigen) continue;
    const double seconds = seconds_for_typical_products(path);
    if (seconds < best_seconds) {
      best = path;
      best_seconds = seconds;
    }
  }
  log::info("matrix products through {}, measured at {:.2f}x Eigen's speed on typical products (COHORT_GEMM=fastest; "
            "a run that measures again may choose otherwise, and the two round differently)",
            gemm_path_name(best), eigen_seconds / std::min(best_seconds, eigen_seconds));
  return best;
}

constexpr std::string_view kMeasure = "fastest";

// The path COHORT_GEMM's value `name` chooses: a path's name, or the measured fastest.
GemmPath named(std::string_view name) {
  if (const auto path = gemm_path_named(name)) return *path;
  if (name == kMeasure) return measured_fastest();
  throw InvalidArgument(fmt::format("COHORT_GEMM={}: this build computes matrix products with {}", name,
                                    available_gemm_paths().size() == 1 ? "eigen only" : "eigen or openblas, or the fastest of them"));
}

}  // namespace

std::string_view gemm_path_name(GemmPath path) { return path == GemmPath::OpenBlas ? "openblas" : "eigen"; }

std::optional<GemmPath> gemm_path_named(std::string_view name) {
  for (GemmPath path : available_gemm_paths())
    if (gemm_path_name(path) == name) return path;
  return std::nullopt;
}

bool gemm_path_named_by_setting() {
  const char* name = std::getenv("COHORT_GEMM");
  return name != nullptr && *name != '\0' && name != kMeasure;
}

std::vector<GemmPath> available_gemm_paths() {
  return COHORT_HAS_OPENBLAS ? std::vector{GemmPath::Eigen, GemmPath::OpenBlas} : std::vector{GemmPath::Eigen};
}

GemmPath gemm_path() {
  if (const int path = chosen.load(std::memory_order_acquire); path != kUnchosen) return static_cast<GemmPath>(path);
  std::call_once(first_choice, [] {
    if (chosen.load() != kUnchosen) return;  // set_gemm_path came first
    const char* name = std::getenv("COHORT_GEMM");
    const GemmPath path = name != nullptr && *name != '\0' ? named(name) : GemmPath::Eigen;
    int expected = kUnchosen;
    chosen.compare_exchange_strong(expected, static_cast<int>(path));
  });
  return static_cast<GemmPath>(chosen.load(std::memory_order_acquire));
}

void set_gemm_path(GemmPath path) {
  const std::vector<GemmPath> paths = available_gemm_paths();
  COHORT_CHECK(std::find(paths.begin(), paths.end(), path) != paths.end(), "this build has no {} matrix products",
               gemm_path_name(path));
  chosen.store(static_cast<int>(path), std::memory_order_release);
}

std::string_view cpu_isa_name() { return cpu::winograd_isa_name(cpu::winograd_isa()); }

bool cpu_isa_named_by_setting() {
  const char* name = std::getenv("COHORT_CPU_ISA");
  return name != nullptr && *name != '\0';
}

bool use_cpu_isa_named(std::string_view name) {
  for (cpu::WinogradIsa isa : cpu::usable_winograd_isas())
    if (cpu::winograd_isa_name(isa) == name) {
      cpu::set_winograd_isa(isa);
      return true;
    }
  return false;
}

void check_cpu_kernel_settings() {
  if (const char* name = std::getenv("COHORT_GEMM"); name != nullptr && *name != '\0' && name != kMeasure) named(name);
  cpu::winograd_isa();
  cpu::onednn::bf16_kernels();
}

namespace cpu {

void gemm(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
          const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // no product: c = beta * c, and never 0 * NaN
    for (std::int64_t row = 0; row < m; ++row)
      for (std::int64_t column = 0; column < n; ++column) c[row * ldc + column] = beta == 0.0f ? 0.0f : beta * c[row * ldc + column];
    return;
  }
#if COHORT_HAS_OPENBLAS
  if (gemm_path() == GemmPath::OpenBlas) return openblas_gemm(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
  eigen_gemm(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace cpu
}  // namespace cohort
