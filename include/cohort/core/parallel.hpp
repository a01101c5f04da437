#pragma once
// The CPU thread budget shared by every multithreaded op (OpenMP underneath).
//
//   cohort::set_num_threads(2);   // 0 restores the default: OMP_NUM_THREADS when set, else all cores

namespace cohort {

void set_num_threads(int threads);
int num_threads();
// The cores this process may run on: its affinity mask, as a container or taskset leaves it.
int usable_cores();

}  // namespace cohort
