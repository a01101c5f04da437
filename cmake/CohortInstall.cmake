# install(): headers, the library and an exported package so that `find_package(cohort)` works.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS cohort-launch RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS cohort EXPORT cohortTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/cohort DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_BINARY_DIR}/include/cohort/core/config.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/cohort/core)

set(COHORT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/cohort)
install(EXPORT cohortTargets NAMESPACE cohort:: DESTINATION ${COHORT_CMAKE_DIR})
configure_package_config_file(cmake/cohortConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/cohortConfig.cmake
                              INSTALL_DESTINATION ${COHORT_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cohortConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cohortConfig.cmake ${PROJECT_BINARY_DIR}/cohortConfigVersion.cmake
        DESTINATION ${COHORT_CMAKE_DIR})
