// The same sweep with Open MPI's MPI_Allreduce, for comparison. Run it under mpirun:
//   mpirun -np 4 --oversubscribe ./build/benchmarks/mpi_allreduce_bench
#include <mpi.h>

#include <cstdio>

#include "../allreduce_sweep.hpp"

int main(int argc, char** argv) {
  const auto began = std::chrono::steady_clock::now();
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int status = 0;
  const auto allreduce = [](float* data, std::size_t count) {
    MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  };
  const auto barrier = [] { MPI_Barrier(MPI_COMM_WORLD); };
  try {
    const sweep::Options options = sweep::parse(argc, argv);
    status = options.startup ? sweep::report_startup(began, rank, size, allreduce, barrier)
                             : sweep::run("Open MPI MPI_Allreduce", rank, size, options, allreduce, barrier);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_allreduce_bench: %s\n", e.what());
    status = 1;
  }
  MPI_Finalize();
  return status;
}
