# Test helpers.
#
#   epo_add_gtest(NAME SOURCES...)          one GoogleTest binary, each TEST a CTest case
#   epo_add_mpi_run(TARGET NP)              run an MPI GoogleTest binary (linked with
#                                           tests/mpi_main.cpp, which initializes MPI and fails
#                                           the whole job if any rank fails) as `mpirun -np NP`
#                                           through scripts/mpi_test_run.sh
#
# mpirun flags: OpenMPI refuses to run as root and to place more ranks than cores unless told;
# MPICH's hydra needs neither flag. EPO_MPIEXEC_FLAGS holds what the detected launcher needs.
include(GoogleTest)

execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _epo_mpiexec_version
                ERROR_VARIABLE _epo_mpiexec_version)
if(_epo_mpiexec_version MATCHES "Open MPI|OpenRTE")
  set(EPO_MPIEXEC_FLAGS --allow-run-as-root --oversubscribe)
else()
  set(EPO_MPIEXEC_FLAGS "")
endif()

function(epo_add_gtest name)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE epo GTest::gtest GTest::gtest_main)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60
                       PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1")
endfunction()

# Every MPI job of the tests runs through scripts/mpi_test_run.sh, which reruns a job once when
# every rank passed and only Open MPI's teardown race failed it (the script says why).
set(EPO_MPI_TEST_RUN bash ${PROJECT_SOURCE_DIR}/scripts/mpi_test_run.sh ${MPIEXEC_EXECUTABLE}
    ${EPO_MPIEXEC_FLAGS})

function(epo_add_mpi_run target np)
  add_test(NAME ${target}_np${np}
           COMMAND ${EPO_MPI_TEST_RUN} ${MPIEXEC_NUMPROC_FLAG} ${np} $<TARGET_FILE:${target}>)
  # Ranks launched on this host inherit mpirun's environment (OpenMPI and MPICH alike).
  set_tests_properties(${target}_np${np} PROPERTIES TIMEOUT 900 LABELS mpi
                       ENVIRONMENT "OMP_NUM_THREADS=1")
endfunction()
