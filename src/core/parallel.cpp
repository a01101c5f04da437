#include "cohort/core/parallel.hpp"

#include <omp.h>

#include <cstdlib>
#include <thread>

#include "cohort/core/check.hpp"

namespace cohort {

void set_num_threads(int threads) {
  COHORT_CHECK(threads >= 0, "thread count must be >= 0, got {}", threads);
  if (threads == 0) {
    // The default: OMP_NUM_THREADS when set (cohort-launch shares the cores among its processes), else all.
    const char* chosen = std::getenv("OMP_NUM_THREADS");
    const int from_environment = chosen != nullptr ? std::atoi(chosen) : 0;
    threads = from_environment > 0 ? from_environment : static_cast<int>(std::thread::hardware_concurrency());
  }
  omp_set_num_threads(threads);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace cohort
