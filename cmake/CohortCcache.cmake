# Use ccache for every compiler when it is installed: rebuilds on 2 cores are dominated by Eigen.
find_program(COHORT_CCACHE ccache)
if(COHORT_CCACHE)
  # The sloppiness lets ccache cache the files compiled with a precompiled header (the tests').
  set(CMAKE_CXX_COMPILER_LAUNCHER "${CMAKE_COMMAND};-E;env;CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime;${COHORT_CCACHE}")
  set(CMAKE_CUDA_COMPILER_LAUNCHER "${COHORT_CCACHE}")
endif()
