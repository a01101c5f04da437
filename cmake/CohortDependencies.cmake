# Third-party packages, all from Debian: Eigen (CPU math), fmt, cereal, zlib, nlohmann-json (cluster
# configuration), standalone Asio and OpenSSL's libcrypto and libssl (the TCP transport and its TLS), OpenMP, threads.
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(Eigen3 3.4 REQUIRED NO_MODULE)
find_package(fmt REQUIRED)
find_package(ZLIB REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(OpenSSL 3 REQUIRED COMPONENTS Crypto SSL)
find_package(CLI11 2 REQUIRED)
find_path(COHORT_ASIO_INCLUDE_DIR asio.hpp REQUIRED)
# Asio decides how it allocates handler memory (aligned_alloc or operator new) from a libstdc++ macro
# defined only once a standard header is in, so a file that includes Asio first decided otherwise than the
# rest, and one file's inline code freed with operator delete what another's had taken from aligned_alloc.
# One choice for every file.
add_compile_definitions(ASIO_DISABLE_STD_ALIGNED_ALLOC)
find_path(COHORT_CEREAL_INCLUDE_DIR cereal/cereal.hpp REQUIRED)
# Open MPI is optional: the MPI communicator is built when COHORT_WITH_MPI is on and MPI is found. Its C
# API through the CXX component, without the deprecated C++ bindings.
set(COHORT_HAS_MPI OFF)
if(COHORT_WITH_MPI)
  set(MPI_CXX_SKIP_MPICXX ON)
  find_package(MPI COMPONENTS CXX)
  if(MPI_CXX_FOUND)
    set(COHORT_HAS_MPI ON)
  else()
    message(STATUS "cohort: no MPI found, building without the MPI communicator")
  endif()
endif()
# OpenBLAS is optional: its OpenMP build (Debian's libopenblas-openmp-dev), which shares cohort's OpenMP
# threads and stays single-threaded inside cohort's parallel regions; the pthread build would compete with
# them. Where it is found, COHORT_GEMM=openblas or fastest chooses it for the CPU backend (gemm_path.hpp).
set(COHORT_HAS_OPENBLAS OFF)
if(COHORT_WITH_OPENBLAS)
  find_path(COHORT_OPENBLAS_INCLUDE_DIR cblas.h PATHS /usr/include/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp NO_DEFAULT_PATH)
  find_library(COHORT_OPENBLAS_LIBRARY openblas PATHS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp NO_DEFAULT_PATH)
  if(COHORT_OPENBLAS_INCLUDE_DIR AND COHORT_OPENBLAS_LIBRARY)
    set(COHORT_HAS_OPENBLAS ON)
  else()
    message(STATUS "cohort: no OpenMP build of OpenBLAS found (libopenblas-openmp-dev), matrix products through Eigen only")
  endif()
endif()
# An optional library found by its header and library, when COHORT_WITH_<NAME> is on: sets COHORT_HAS_<NAME>,
# COHORT_<NAME>_INCLUDE_DIR and COHORT_<NAME>_LIBRARY, or says what the build does without it.
function(cohort_find_optional name header library without)
  set(COHORT_HAS_${name} OFF PARENT_SCOPE)
  if(NOT COHORT_WITH_${name})
    return()
  endif()
  find_path(COHORT_${name}_INCLUDE_DIR ${header})
  find_library(COHORT_${name}_LIBRARY ${library})
  if(COHORT_${name}_INCLUDE_DIR AND COHORT_${name}_LIBRARY)
    set(COHORT_HAS_${name} ON PARENT_SCOPE)
  else()
    message(STATUS "cohort: ${without}")
  endif()
endfunction()
# oneDNN is optional: the CPU's bfloat16 convolutions and matrix products (Debian's libdnnl-dev, built on
# OpenMP as cohort is). Without it, bfloat16 computes through float32 stand-ins.
cohort_find_optional(ONEDNN oneapi/dnnl/dnnl.hpp dnnl "no oneDNN found (libdnnl-dev), bfloat16 computes through float32 on the CPU")
# Intel's ipsec-mb is optional (Debian's libipsec-mb-dev, x86-64 only): the AES-GCM of TLS records, with
# VAES and AVX-512 where the processor has them. Without it OpenSSL protects the records.
cohort_find_optional(IPSEC_MB intel-ipsec-mb.h IPSec_MB "no ipsec-mb found (libipsec-mb-dev), OpenSSL protects TLS records")
# Intel's ISA-L is optional (Debian's libisal-dev): the CRC-32C of parameter-server payloads, folded with
# carry-less multiplication. Without it the SSE4.2 crc32 instruction computes it, at about half the speed.
cohort_find_optional(ISAL isa-l/crc.h isal "no ISA-L found (libisal-dev), CRC-32C through the SSE4.2 instruction")
