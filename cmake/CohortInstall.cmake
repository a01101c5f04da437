# install(): headers, the library, its run-time parts and an exported package, so that
# `find_package(cohort [COMPONENTS cuda mpi])` and `pkg-config cohort` work from wherever the prefix is.
# Components of the installation (and of the Debian packages, CohortPackage.cmake): runtime (libcohort and
# cohort-launch), development (headers, CMake and pkg-config files), cuda (the CUDA backend and NCCL parts),
# mpi (the MPI communicator's part).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS cohort-launch cohort-plan RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(TARGETS cohort EXPORT cohortTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT development)
foreach(part IN LISTS COHORT_PARTS)
  if(part MATCHES "^cohort_(cuda|nccl)$")
    set(component cuda)
  else()
    set(component mpi)
  endif()
  # Next to libcohort, where it looks for them.
  install(TARGETS ${part} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT ${component})
endforeach()
install(DIRECTORY include/cohort DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT development)
install(FILES ${PROJECT_BINARY_DIR}/include/cohort/core/config.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/cohort/core COMPONENT development)

set(COHORT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/cohort)
install(EXPORT cohortTargets NAMESPACE cohort:: DESTINATION ${COHORT_CMAKE_DIR} COMPONENT development)
configure_package_config_file(cmake/cohortConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/cohortConfig.cmake
                              INSTALL_DESTINATION ${COHORT_CMAKE_DIR} PATH_VARS CMAKE_INSTALL_LIBDIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cohortConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cohortConfig.cmake ${PROJECT_BINARY_DIR}/cohortConfigVersion.cmake
        DESTINATION ${COHORT_CMAKE_DIR} COMPONENT development)

# pkg-config, for builds without CMake; its prefix is found from where the file lies.
file(RELATIVE_PATH COHORT_PC_TO_PREFIX ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
configure_file(cmake/cohort.pc.in ${PROJECT_BINARY_DIR}/cohort.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/cohort.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT development)
