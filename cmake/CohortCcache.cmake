# Use ccache for every compiler when it is installed: rebuilds on 2 cores are dominated by Eigen.
find_program(COHORT_CCACHE ccache)
if(COHORT_CCACHE)
  set(CMAKE_CXX_COMPILER_LAUNCHER "${COHORT_CCACHE}")
  set(CMAKE_CUDA_COMPILER_LAUNCHER "${COHORT_CCACHE}")
endif()
