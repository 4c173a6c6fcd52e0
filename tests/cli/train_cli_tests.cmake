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

# Ranks started by a plain mpirun whose OpenMP threads outnumber the host's CPUs (2 ranks of as
# many threads as the machine has CPUs: twice its CPUs): a warning that names the counts and the
# fix, and the run goes on.
cmake_host_system_information(RESULT _cpus QUERY NUMBER_OF_LOGICAL_CORES)
epo_train_cli_test(train_warns_of_omp_oversubscription 0
                   "epo: warning: 2 rank\\(s\\) on this host each start ${_cpus} OpenMP thread\\(s\\).*set OMP_NUM_THREADS="
                   " iteration +4/ +4 \\|"
                   NP 2 ENV OMP_NUM_THREADS=${_cpus} RUN ${_tiny_train})

# One rank fails inside an overlap step: the job ends (exit 1) with the rank and the reason.
epo_train_cli_test(train_rank_failure_ends_job 1
                   "rank 1 of 2 failed: .*injected failure \\(EPO_INJECT_FAILURE\\) in mb1.layer1.dispatch.forward of step 2"
                   NP 2 ENV EPO_INJECT_FAILURE=1:2:mb1.layer1.dispatch.forward
                   RUN ${_tiny_train} --moe_a2a_overlap true)

# A malformed injection switch is a usage error before any step.
epo_train_cli_test(train_bad_injection 2 "EPO_INJECT_FAILURE='oops' is not RANK:STEP:CALL"
                   NP 1 ENV EPO_INJECT_FAILURE=oops RUN train --model tiny-moe --max_steps 3
                   logger.log_dir=train-cli-runs)

# Start-up refusals (docs/checkpoint.md, docs/runtime.md "Memory"): known before the first step,
# so every rank stops within seconds with the field, the value and the fix. A checkpoint.load
# naming a file used to keep the other rank waiting comm.timeout_s (302 s) before a false
# communication error; an unwritable checkpoint.save was found only at the first save.
epo_train_cli_test(train_load_is_a_file 2 "checkpoint.load = '.*train_cli_tests.cmake' is not a directory"
                   NP 2 RUN ${_tiny_train} checkpoint.load=${CMAKE_CURRENT_LIST_FILE})
set_tests_properties(cli.train_load_is_a_file PROPERTIES TIMEOUT 60)
epo_train_cli_test(train_load_missing 1 "checkpoint.load = 'no/such/ckpt' does not exist"
                   NP 2 RUN ${_tiny_train} checkpoint.load=no/such/ckpt)
epo_train_cli_test(train_save_is_dev_null 1
                   "checkpoint.save = '/dev/null' is not a directory \\(a device\\); give checkpoint.save a directory"
                   NP 2 RUN ${_tiny_train} checkpoint.save=/dev/null)
epo_train_cli_test(train_save_unwritable 1 "checkpoint.save = '/proc/epo-ckpt' cannot be created"
                   NP 2 RUN ${_tiny_train} checkpoint.save=/proc/epo-ckpt)
# A model that cannot fit any machine (1.2 TB per rank): refused before any allocation, with both numbers
# (formerly: "internal error: std::bad_alloc").
epo_train_cli_test(train_cannot_fit 1 "the run needs about [0-9.]+ GiB of memory"
                   "GiB available" "model.hidden_size" NP 1
                   RUN train --model tiny-moe --max_steps 3 logger.log_dir=train-cli-runs
                   model.hidden_size=65536 model.num_layers=64)
# A link so slow that one all-to-all outlasts comm.timeout_s is refused at validation (it held
# every collective for years); 1e-300 Gbit/s no longer turns the link model off.
epo_train_cli_test(train_link_too_slow 1 "VA004" "comm.link.intra_node_gbps" NP 2
                   RUN ${_tiny_train} comm.link.intra_node_gbps=0.001 comm.timeout_s=0.5)
epo_train_cli_test(train_link_denormal 1 "VA003" "comm.link.intra_node_gbps=1e-300" NP 2
                   RUN ${_tiny_train} comm.link.intra_node_gbps=1e-300)

# The rank torn down after its peer failed says so instead of promising a checkpoint; no source
# locations in a user's error.
epo_train_cli_test(train_survivor_says_peer_failed 1
                   "rank 0 of 2 received SIGTERM: the job is ending because rank 1 failed"
                   "rank 1 of 2 failed: .*injected failure \\(EPO_INJECT_FAILURE\\) in mb1.layer1.dispatch.forward of step 2: the node's own work failed"
                   NP 2 ENV EPO_INJECT_FAILURE=1:2:mb1.layer1.dispatch.forward
                   RUN ${_tiny_train} --moe_a2a_overlap true)

# The flex dispatcher (docs/flex.md): a 2-node run with EP overlap logs the dispatcher type and
# backend in its finalized config and finishes; nodes of 3 cannot tile an EP group of 2, refused
# before any rank works (RT026) naming the field.
epo_train_cli_test(train_flex_two_nodes 0 "moe_token_dispatcher_type: flex"
                   "moe_flex_dispatcher_backend: deepep"
                   " iteration +4/ +4 \\| consumed samples: +32 \\|.*lm loss: [0-9.E+-]+ \\|"
                   NP 2 RUN ${_tiny_train} --moe_a2a_overlap true --num_nodes 2 --gpus_per_node 1
                   --moe_flex_dispatcher_backend deepep)
epo_train_cli_test(train_flex_nodes_do_not_tile 1 "RT026" "comm.gpus_per_node" NP 1
                   RUN train --model tiny-moe -ep 2 --max_steps 3 --num_nodes 2 --gpus_per_node 3
                   --moe_flex_dispatcher_backend deepep logger.log_dir=train-cli-runs)

# Pipeline parallelism (docs/pipeline.md): a stage that fails in the middle of an interleaved,
# overlapped step ends the whole job, its rank named; the other stage's ranks say why they stop.
epo_train_cli_test(train_pipeline_stage_failure_ends_job 1
                   "rank 3 of 4 failed: .*injected failure \\(EPO_INJECT_FAILURE\\) in stage1.chunk1.mb1.layer3.mlp.forward of step 2"
                   "rank 0 of 4 received SIGTERM: the job is ending because rank 3 failed"
                   NP 4 ENV EPO_INJECT_FAILURE=3:2:stage1.chunk1.mb1.layer3.mlp.forward
                   RUN train --model tiny-moe -ep 2 -pp 2 -vp 2 --max_steps 4
                   train.global_batch_size=16 model.seq_length=64 model.num_layers=4
                   logger.log_dir=train-cli-runs --moe_a2a_overlap true)
# An OMP_NUM_THREADS that OpenMP cannot start is refused by name before any kernel runs (it was
# reported as "out of memory" from inside oneDNN).
epo_train_cli_test(train_omp_threads_absurd 2 "OMP_NUM_THREADS=99999999999: not a thread count"
                   NP 1 ENV OMP_NUM_THREADS=99999999999 RUN ${_tiny_train})
epo_train_cli_test(train_omp_threads_not_a_number 2 "OMP_NUM_THREADS=two: not a thread count"
                   NP 1 ENV OMP_NUM_THREADS=two RUN ${_tiny_train})
