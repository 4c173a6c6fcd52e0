# `epo train` under mpirun: a short run to the end, and a failure injected on one rank in the
# middle of a combined (overlap) step, which must end the whole job with a message naming the
# rank, well within the test's timeout, instead of leaving the other rank waiting.
#   epo_train_cli_test(NAME STATUS [PATTERN...] NP N [ENV VAR=VALUE...] RUN ARGS...)
function(epo_train_cli_test name status)
  cmake_parse_arguments(PARSE_ARGV 2 ARG "" "NP" "ENV;RUN")
  add_test(NAME cli.${name}
           COMMAND ${CMAKE_COMMAND} -E env OMP_NUM_THREADS=1 ${ARG_ENV}
                   bash ${_epo_cli_expect} ${status} ${ARG_UNPARSED_ARGUMENTS} --
                   ${MPIEXEC_EXECUTABLE} ${EPO_MPIEXEC_FLAGS} ${MPIEXEC_NUMPROC_FLAG} ${ARG_NP}
                   $<TARGET_FILE:epo_cli> ${ARG_RUN}
           WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(cli.${name} PROPERTIES LABELS "cli;mpi" TIMEOUT 120)
endfunction()

set(_tiny_train train --model tiny-moe -ep 2 --max_steps 4 train.global_batch_size=8
    model.seq_length=64 logger.log_dir=train-cli-runs)

# A mock-data run on 2 ranks: logs the finalized config, every iteration, and finishes.
epo_train_cli_test(train_two_ranks 0 "^# epo: configuration finalized, no error"
                   " iteration +4/ +4 \\| consumed samples: +32 \\|.*lm loss: [0-9.E+-]+ \\|"
                   NP 2 RUN ${_tiny_train} --moe_a2a_overlap true)

# One rank fails inside an overlap step: the job ends (exit 1) with the rank and the reason.
epo_train_cli_test(train_rank_failure_ends_job 1
                   "rank 1 of 2 failed: .*injected failure \\(EPO_INJECT_FAILURE\\) in mb1.layer1.dispatch.forward of step 2"
                   NP 2 ENV EPO_INJECT_FAILURE=1:2:mb1.layer1.dispatch.forward
                   RUN ${_tiny_train} --moe_a2a_overlap true)

# A malformed injection switch is a usage error before any step.
epo_train_cli_test(train_bad_injection 2 "EPO_INJECT_FAILURE='oops' is not RANK:STEP:CALL"
                   NP 1 ENV EPO_INJECT_FAILURE=oops RUN train --model tiny-moe --max_steps 3
                   logger.log_dir=train-cli-runs)
