#include "cohort/core/parallel.hpp"

#include <omp.h>

#include <thread>

#include "cohort/core/check.hpp"

namespace cohort {

void set_num_threads(int threads) {
  COHORT_CHECK(threads >= 0, "thread count must be >= 0, got {}", threads);
  omp_set_num_threads(threads == 0 ? static_cast<int>(std::thread::hardware_concurrency()) : threads);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace cohort
