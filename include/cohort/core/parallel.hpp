#pragma once
// The CPU thread budget shared by every multithreaded op (OpenMP underneath).
//
//   cohort::set_num_threads(2);   // 0 restores the default: OMP_NUM_THREADS when set, else all cores

namespace cohort {

void set_num_threads(int threads);
int num_threads();

}  // namespace cohort
