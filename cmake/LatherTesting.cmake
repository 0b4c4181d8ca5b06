# lather_add_test(<name> SOURCES <files...> LABELS <labels...> [RANKS <n...>] [TIMEOUT <s>]
#                 [MPI] [UNDER_TIMEOUT] [ARGS <args...>] [LIBRARIES <targets...>])
# One GoogleTest executable, registered with ctest once, or once per rank count under mpiexec
# (as <name>_np<N>, label "mpi" added). Every test must carry an area label. UNDER_TIMEOUT: the
# command runs under coreutils `timeout`, 10 s before ctest's TIMEOUT (SIGTERM, SIGKILL 5 s later),
# so a test whose ranks may block (the fault-injection tests) ends with exit code 124 and takes
# its mpiexec and every rank with it.
set(LATHER_TEST_RANKS 1 2 3 4 8 CACHE STRING "Rank counts the MPI tests run with")
set(LATHER_MPIEXEC_PREFLAGS "" CACHE STRING "Extra flags for mpiexec before the program")
set(LATHER_TEST_THREADS 1 CACHE STRING "OMP_NUM_THREADS for each test process (OpenMP backends)")
# BLAS stays single-threaded: its threads would fight Kokkos' and the oversubscribed MPI ranks.
# OpenMP threads sleep instead of spinning at barriers: MPI tests run up to 8 ranks x
# LATHER_TEST_THREADS threads on however few cores there are, and spinning threads then take the
# cores from the ones with work (test_training_np4 with 2 threads on 2 busy cores: > 900 s with
# libgomp's default spin, 50 s with PASSIVE).
set(_lather_test_environment
    "OMP_NUM_THREADS=${LATHER_TEST_THREADS};OPENBLAS_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE")
if(MPIEXEC_EXECUTABLE AND NOT LATHER_MPIEXEC_PREFLAGS)
  # Open MPI refuses more ranks than cores unless told; MPICH oversubscribes by default.
  execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _mpiexec_version
                  ERROR_QUIET)
  if(_mpiexec_version MATCHES "Open MPI|OpenRTE")
    set(LATHER_MPIEXEC_PREFLAGS "--oversubscribe" CACHE STRING "" FORCE)
  endif()
endif()

find_program(LATHER_TIMEOUT_EXECUTABLE timeout DOC "coreutils timeout, for tests registered UNDER_TIMEOUT")

function(lather_add_test name)
  cmake_parse_arguments(ARG "MPI;UNDER_TIMEOUT" "TIMEOUT" "SOURCES;LABELS;RANKS;ARGS;LIBRARIES" ${ARGN})
  if(NOT ARG_LABELS)
    message(FATAL_ERROR "lather_add_test(${name}): every test needs an area label")
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set(_launcher "")
  if(ARG_UNDER_TIMEOUT)
    if(NOT LATHER_TIMEOUT_EXECUTABLE)
      message(FATAL_ERROR "lather_add_test(${name} UNDER_TIMEOUT): coreutils `timeout` was not found")
    endif()
    math(EXPR _seconds "${ARG_TIMEOUT} - 10")
    set(_launcher ${LATHER_TIMEOUT_EXECUTABLE} --kill-after=5 ${_seconds})
  endif()
  add_executable(${name} ${ARG_SOURCES})
  if(LATHER_PRECOMPILE_HEADERS)
    if(ARG_MPI)
      target_precompile_headers(${name} REUSE_FROM lather_test_mpi_main)
    else()
      target_precompile_headers(${name} REUSE_FROM lather_test_main)
    endif()
  endif()
  if(ARG_MPI)
    target_link_libraries(${name} PRIVATE lather_test_mpi_main ${ARG_LIBRARIES})
    if(NOT ARG_RANKS)
      set(ARG_RANKS ${LATHER_TEST_RANKS})
    endif()
    foreach(n IN LISTS ARG_RANKS)
      add_test(NAME ${name}_np${n}
               COMMAND ${_launcher} ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${LATHER_MPIEXEC_PREFLAGS}
                       ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${name}> ${MPIEXEC_POSTFLAGS} ${ARG_ARGS})
      set_tests_properties(${name}_np${n} PROPERTIES LABELS "${ARG_LABELS};mpi"
                           TIMEOUT ${ARG_TIMEOUT} PROCESSORS ${n}
                           ENVIRONMENT "${_lather_test_environment}")
    endforeach()
  else()
    target_link_libraries(${name} PRIVATE lather_test_main ${ARG_LIBRARIES})
    if(_launcher)
      add_test(NAME ${name} COMMAND ${_launcher} $<TARGET_FILE:${name}> ${ARG_ARGS})
    else()
      add_test(NAME ${name} COMMAND ${name} ${ARG_ARGS})
    endif()
    set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
                         ENVIRONMENT "${_lather_test_environment}")
  endif()
endfunction()
