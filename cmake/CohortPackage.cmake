# `make package` (cpack): Debian packages from the install components (CohortInstall.cmake):
#   cohort       libcohort and cohort-launch; needs no CUDA or MPI library
#   cohort-dev   headers, CMake config and pkg-config files
#   cohort-cuda  the CUDA backend and NCCL parts, when this build has them (NVIDIA's libraries come from
#                outside Debian's archive, so they are not listed as dependencies: a missing one is named
#                when a CUDA device is first asked for)
#   cohort-mpi   the MPI communicator's part, when this build has it
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME cohort)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_PACKAGE_CONTACT "cohort maintainers <maintainers@cohort.invalid>")
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)  # each part depends on the cohort of its own version
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)          # Debian dependencies from the libraries each file needs
# libcohort, which the parts need, comes from the cohort package, not from the archive.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${PROJECT_BINARY_DIR}/src)

set(CPACK_COMPONENTS_ALL runtime development)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME cohort)
if(COHORT_HAS_OPENBLAS)
  set(CPACK_DEBIAN_RUNTIME_PACKAGE_DEPENDS libopenblas0-openmp)  # the variant libcohort's run path names
endif()
set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_NAME cohort-dev)
set(CPACK_COMPONENT_DEVELOPMENT_DEPENDS runtime)
set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_DEPENDS "libfmt-dev")  # the headers include fmt's
set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_SECTION libdevel)
if(COHORT_HAS_CUDA)
  list(APPEND CPACK_COMPONENTS_ALL cuda)
  set(CPACK_DEBIAN_CUDA_PACKAGE_NAME cohort-cuda)
  set(CPACK_COMPONENT_CUDA_DEPENDS runtime)
  set(CPACK_DEBIAN_CUDA_PACKAGE_SHLIBDEPS OFF)
endif()
if(COHORT_HAS_MPI)
  list(APPEND CPACK_COMPONENTS_ALL mpi)
  set(CPACK_DEBIAN_MPI_PACKAGE_NAME cohort-mpi)
  set(CPACK_COMPONENT_MPI_DEPENDS runtime)
endif()
include(CPack)
