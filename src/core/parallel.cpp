#include "cohort/core/parallel.hpp"

#include <omp.h>
#include <sched.h>

#include <algorithm>

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

int usable_cores() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace cohort
