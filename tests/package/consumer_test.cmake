# Installs cohort from BUILD_DIR into a scratch prefix and moves the prefix elsewhere (the package must
# be relocatable), then builds and runs the consumer project in SOURCE_DIR against it as an outside user
# would: with find_package(cohort COMPONENTS <the parts this build has>) and with pkg-config. The
# consumer, which trains on the CPU, and libcohort must need no CUDA, NCCL or MPI library (ldd); asking for
# a component that is not installed must fail to configure, naming it; without its parts (a CPU-only
# install) the package still builds and runs the consumer.
#   cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... -DHAS_CUDA=0|1 -DHAS_NCCL=0|1 -DHAS_MPI=0|1 -DCXX=... \
#         -P consumer_test.cmake
file(REMOVE_RECURSE ${WORK_DIR})
function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
  if(result)
    message(FATAL_ERROR "${what} failed (${result}):\n${output}")
  endif()
  set(output "${output}" PARENT_SCOPE)
endfunction()
function(needs_no_gpu_or_mpi_library file)
  run("ldd ${file}" ldd ${file})
  if(output MATCHES "(libcuda|libcudart|libcublas|libcudnn|libnccl|libmpi)[^ ]*")
    message(FATAL_ERROR "${file} needs ${CMAKE_MATCH_0}, though it trains on the CPU:\n${output}")
  endif()
endfunction()

run("installing cohort" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/staged)
file(RENAME ${WORK_DIR}/staged ${WORK_DIR}/moved)
set(prefix ${WORK_DIR}/moved)
file(GLOB_RECURSE libcohort ${prefix}/lib*/libcohort.so)
needs_no_gpu_or_mpi_library(${libcohort})
# Each part finds libcohort beside it in the moved prefix, by its own run path.
file(GLOB_RECURSE installed_parts ${prefix}/lib*/libcohort_*.so)
foreach(part IN LISTS installed_parts)
  run("ldd ${part}" ldd ${part})
  if(output MATCHES "libcohort[^ ]* => not found")
    message(FATAL_ERROR "${part} does not find libcohort beside it:\n${output}")
  endif()
endforeach()

set(components "")
if(HAS_CUDA)
  list(APPEND components cuda)
  if(HAS_NCCL)
    list(APPEND components nccl)
  endif()
endif()
if(HAS_MPI)
  list(APPEND components mpi)
endif()
run("configuring the consumer against the moved package" ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${prefix} "-DCOHORT_COMPONENTS=${components}")
run("building the consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run("the consumer program" ${WORK_DIR}/build/consumer)
if(NOT output MATCHES "consumer trained: loss")
  message(FATAL_ERROR "the consumer program did not train:\n${output}")
endif()
message(STATUS "${output}")
needs_no_gpu_or_mpi_library(${WORK_DIR}/build/consumer)

# A part that is not installed fails find_package, naming it.
file(GLOB_RECURSE parts ${prefix}/lib*/libcohort_*.so)
if(parts)
  file(REMOVE ${parts})
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build-without-cuda -DCMAKE_PREFIX_PATH=${prefix}
                        -DCOHORT_COMPONENTS=cuda
                RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
if(NOT result OR NOT output MATCHES "cohort's cuda part is not installed: no libcohort_cuda.so")
  message(FATAL_ERROR "find_package(cohort COMPONENTS cuda) without the part did not fail naming it:\n${output}")
endif()
if(HAS_NCCL)
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build-without-nccl -DCMAKE_PREFIX_PATH=${prefix}
                          -DCOHORT_COMPONENTS=nccl
                  RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
  if(NOT result OR NOT output MATCHES "cohort's nccl part is not installed: no libcohort_nccl.so")
    message(FATAL_ERROR "find_package(cohort COMPONENTS nccl) without the part did not fail naming it:\n${output}")
  endif()
endif()
# Without its parts (a CPU-only install) the package still builds and runs a CPU program.
run("configuring the consumer against the CPU-only package" ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build-cpu-only
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${prefix})
run("building the consumer against the CPU-only package" ${CMAKE_COMMAND} --build ${WORK_DIR}/build-cpu-only)
run("the consumer of the CPU-only package" ${WORK_DIR}/build-cpu-only/consumer)
if(NOT output MATCHES "consumer trained: loss")
  message(FATAL_ERROR "the consumer of the CPU-only package did not train:\n${output}")
endif()

execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build-nonsense -DCMAKE_PREFIX_PATH=${prefix}
                        -DCOHORT_COMPONENTS=nonsense
                RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
if(NOT result OR NOT output MATCHES "cohort has no component 'nonsense': use cuda, mpi or nccl")
  message(FATAL_ERROR "find_package(cohort COMPONENTS nonsense) did not fail naming it:\n${output}")
endif()

# pkg-config, from the moved prefix.
get_filename_component(pc_dir ${libcohort} DIRECTORY)
set(ENV{PKG_CONFIG_PATH} ${pc_dir}/pkgconfig)
run("pkg-config cohort" pkg-config --cflags --libs cohort)
separate_arguments(flags UNIX_COMMAND "${output}")
run("building the consumer with pkg-config's flags" ${CXX} -O1 ${SOURCE_DIR}/main.cpp ${flags} -Wl,-rpath,${pc_dir}
    -o ${WORK_DIR}/consumer-pkg-config)
run("the consumer built with pkg-config" ${WORK_DIR}/consumer-pkg-config)
if(NOT output MATCHES "consumer trained: loss")
  message(FATAL_ERROR "the consumer built with pkg-config did not train:\n${output}")
endif()
