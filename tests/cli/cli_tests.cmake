# Tests of the `epo` command line: each runs the built binary through tests/cli/expect.sh and
# checks the exit status (0 valid, 1 invalid configuration, 2 usage error) and the output.
#   epo_cli_test(NAME STATUS [PATTERN...] RUN ARGS...)   every PATTERN must occur in the output
set(_epo_cli_expect ${CMAKE_CURRENT_LIST_DIR}/expect.sh)
set(_epo_corpus ${PROJECT_SOURCE_DIR}/tests/config/corpus)

function(epo_cli_test name status)
  cmake_parse_arguments(PARSE_ARGV 2 ARG "" "" "RUN")
  add_test(NAME cli.${name}
           COMMAND bash ${_epo_cli_expect} ${status} ${ARG_UNPARSED_ARGUMENTS} --
                   $<TARGET_FILE:epo_cli> ${ARG_RUN}
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(cli.${name} PROPERTIES LABELS cli TIMEOUT 60)
endfunction()

# Help and version.
epo_cli_test(help 0 "validate" RUN --help)
epo_cli_test(version 0 "^epo [0-9]+\\.[0-9]+\\.[0-9]+$" RUN --version)
epo_cli_test(validate_help 0 "--moe_a2a_overlap.*" RUN validate --help)
epo_cli_test(no_subcommand 2 "subcommand" RUN)
epo_cli_test(unknown_subcommand 2 RUN frobnicate)

# Valid configurations (exit 0), with what a run logs.
epo_cli_test(recipe_valid 0 "VALID: 0 errors, 0 warnings \\(target: epo runtime\\)" RUN
             validate --model tiny-moe)
epo_cli_test(finalization_no_error 0 "^# epo: configuration finalized, no error" RUN
             validate --model tiny-moe)
epo_cli_test(example_gpu 0 "VALID: 0 errors.*target: torch 2.7.1 / TE 2.8.0" RUN
             validate examples/qwen3-30b-a3b-ep-overlap.yaml)
epo_cli_test(example_cpu 0 "VALID: 0 errors, 0 warnings" RUN validate examples/tiny-moe-cpu.yaml)
epo_cli_test(a2a_overlap_on 0 "  overlap_moe_expert_parallel_comm: true" RUN
             validate --model qwen3-30b-a3b -ep 16 --num_nodes 2 --gpus_per_node 8
             --moe_a2a_overlap true)
epo_cli_test(a2a_delay_wgrad_on 0 "  delay_wgrad_compute: true" RUN
             validate --model qwen3-30b-a3b -ep 16 --num_nodes 2 --gpus_per_node 8
             --moe_a2a_overlap true)
epo_cli_test(flex_active 0 "moe_token_dispatcher_type: flex" RUN
             validate --model deepseek-v3 --moe_flex_dispatcher_backend deepep env.gpu=h100)
epo_cli_test(flex_backend_logged 0 "moe_flex_dispatcher_backend: hybridep" RUN
             validate --model deepseek-v3 --moe_flex_dispatcher_backend hybridep env.gpu=gb200)
epo_cli_test(flex_fallback 0 "W007" "falling back to the alltoall dispatcher" RUN
             validate --model deepseek-v3 --moe_flex_dispatcher_backend deepep env.gpu=v100)
epo_cli_test(flex_none 0 "moe_token_dispatcher_type: alltoall" RUN
             validate --model deepseek-v3 --moe_flex_dispatcher_backend None)
epo_cli_test(one_dash_flags 0 "\"expert_model_parallel_size\": 4" RUN
             validate --model tiny-moe -ep 4 -gb 8 -mb 1 --gpus_per_node 4 --json)
epo_cli_test(tp_sets_sequence_parallel 0 "\"sequence_parallel\": true" RUN
             validate --model tiny-moe -tp 2 --gpus_per_node 2 --json)
epo_cli_test(vp_none 0 "\"virtual_pipeline_model_parallel_size\": null" RUN
             validate --model qwen3-235b-a22b -vp None --json)
epo_cli_test(override_list_and_null 0 "recompute_modules: \\[core_attn, mlp\\]" RUN
             validate --model tiny-moe "model.recompute_modules=[core_attn,mlp]"
             model.moe_z_loss_coeff=null)
epo_cli_test(json_valid 0 "\"ok\": true," "\"target\": \"epo runtime\"" RUN
             validate --model tiny-moe --json)

# No topology stated (a recipe or a Megatron-Bridge file): the world-size checks wait for the
# launch and say so; a stated topology keeps them.
epo_cli_test(no_topology_defers_world_checks 0 "VALID: 0 errors" "^notes:"
             "no topology stated.*LY002, LY003" RUN validate --model tiny-moe -ep 8
             model.num_moe_experts=16)
epo_cli_test(stated_topology_checks_world 1 "LY002  model.expert_model_parallel_size = 2"
             "world size 3" RUN validate --model tiny-moe -ep 2 --num_nodes 1 --gpus_per_node 3)

# Invalid configurations (exit 1): every violation, with ids and fixes.
epo_cli_test(invalid_ep 1 "EP001  model.expert_model_parallel_size = 1" RUN
             validate --model tiny-moe --moe_a2a_overlap true)
epo_cli_test(invalid_all_at_once 1 "EP012" "EP007" RUN
             validate --model tiny-moe -ep 2 --gpus_per_node 2 --moe_a2a_overlap true
             model.mtp_num_layers=2 model.recompute_granularity=full)
epo_cli_test(invalid_fix_shown 1 "fix: use at most one MTP layer" RUN
             validate --model tiny-moe -ep 2 --gpus_per_node 2 --moe_a2a_overlap true
             model.mtp_num_layers=2)
epo_cli_test(invalid_json 1 "\"ok\": false" "\"id\": \"WG005\"" RUN
             validate examples/tiny-moe-cpu.yaml "model.cuda_graph_modules=[attn]" --json)
epo_cli_test(invalid_range 1 "VA001  model.hidden_size = -4" RUN
             validate --model tiny-moe model.hidden_size=-4)
epo_cli_test(invalid_flex_device 1 "FX001" RUN
             validate --model deepseek-v3 model.moe_token_dispatcher_type=flex
             model.moe_flex_dispatcher_backend=deepep env.gpu=v100)
epo_cli_test(invalid_old_torch 1 "EP005  env.torch_version = 2.5.1" RUN
             validate examples/qwen3-30b-a3b-ep-overlap.yaml env.torch_version=2.5.1)

# Usage errors (exit 2): a message, never a crash.
epo_cli_test(nothing_given 2 "give a CONFIG.yaml or --model" RUN validate)
epo_cli_test(unknown_flag 2 "--bogus" RUN validate --model tiny-moe --bogus)
epo_cli_test(unknown_recipe 2 "unknown recipe 'tiny'.*tiny-moe" RUN validate --model tiny)
epo_cli_test(unknown_key 2 "unknown key 'model.hiden_size'; did you mean 'model.hidden_size'" RUN
             validate --model tiny-moe model.hiden_size=3)
epo_cli_test(wrong_type 2 "model.hidden_size: expected an integer, got 'abc'" RUN
             validate --model tiny-moe model.hidden_size=abc)
epo_cli_test(null_number 2 "model.num_layers: null is not allowed here" RUN
             validate --model tiny-moe model.num_layers=null)
epo_cli_test(huge_value 2 "expected an integer, got '1e99'" RUN validate --model tiny-moe model.hidden_size=1e99)
epo_cli_test(huge_value_int 2 "out of range" RUN
             validate --model tiny-moe model.seq_length=123456789012345678901234567890)
epo_cli_test(bad_flag_value 2 RUN validate --model tiny-moe -tp abc)
epo_cli_test(bad_flag_overflow 2 RUN validate --model tiny-moe -ep 99999999999)
epo_cli_test(bad_vp 2 "-vp takes an integer or None" RUN validate --model tiny-moe -vp two)
epo_cli_test(bad_a2a 2 "--moe_a2a_overlap takes true or false" RUN
             validate --model tiny-moe --moe_a2a_overlap maybe)
epo_cli_test(bad_flex_backend 2 RUN validate --model tiny-moe --moe_flex_dispatcher_backend ncclep)
epo_cli_test(missing_file 2 "no such file" RUN validate does/not/exist.yaml)
epo_cli_test(two_files 2 "two configuration files" RUN
             validate examples/tiny-moe-cpu.yaml examples/qwen3-30b-a3b-ep-overlap.yaml)
epo_cli_test(recipe_conflict 2 "names recipe 'tiny-moe' but --model says 'deepseek-v3'" RUN
             validate examples/tiny-moe-cpu.yaml --model deepseek-v3)
epo_cli_test(malformed_yaml 2 "bad_unclosed_flow.yaml:[0-9]+:[0-9]+: malformed YAML" RUN
             validate ${_epo_corpus}/bad_unclosed_flow.yaml)
epo_cli_test(unknown_key_in_file 2 "bad_unknown_key.yaml:[0-9]+:[0-9]+: unknown key .*did you mean" RUN
             validate ${_epo_corpus}/bad_unknown_key.yaml)
epo_cli_test(empty_file 2 "empty" RUN validate ${_epo_corpus}/bad_empty.yaml)
epo_cli_test(binary_file 2 RUN validate ${_epo_corpus}/bad_binary.yaml)
epo_cli_test(deep_nesting 2 "nesting too deep" RUN validate ${_epo_corpus}/bad_deep_nesting.yaml)
epo_cli_test(unknown_device_flex 1 "names no known device" RUN
             validate --model tiny-moe --moe_flex_dispatcher_backend deepep env.gpu=tpu)
include(${CMAKE_CURRENT_LIST_DIR}/train_cli_tests.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/plan_cli_tests.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/bridge_cli_tests.cmake)

# scripts/sweep_overlap.py end to end on tiny-moe (2 ranks as 2 nodes, 2 micro-batches, link model
# off and calibrated to 1): both points run and the table, CSV and figure are written.
add_test(NAME cli.sweep_overlap_script
         COMMAND ${CMAKE_COMMAND} -E env OMP_NUM_THREADS=1
                 bash ${_epo_cli_expect} 0 "\\| off \\| 2 \\| - \\|.*\\| yes \\|"
                 "\\| 1 \\| 2 \\| [0-9.]+ \\|.*\\| yes \\|" "wrote sweep-test/sweep.csv, sweep.md, overlap-sweep.svg"
                 -- bash -c "rm -rf sweep-test && exec python3 ${PROJECT_SOURCE_DIR}/scripts/sweep_overlap.py sweep-test --ratios 0,1 --micro_batches 2 --epo $<TARGET_FILE:epo_cli> -- --model tiny-moe --num_nodes 2 --gpus_per_node 1 -ep 2 model.seq_length=64"
         WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
set_tests_properties(cli.sweep_overlap_script PROPERTIES LABELS "cli;mpi" TIMEOUT 300)

# Values the link model cannot honour, and a deadline that would overflow.
epo_cli_test(timeout_too_large 1 "VA001  comm.timeout_s = 1e\\+10" RUN
             validate --model tiny-moe comm.timeout_s=1e10)
epo_cli_test(link_denormal 1 "VA003  comm.link.inter_node_gbps = 1e-300" RUN
             validate --model tiny-moe comm.link.inter_node_gbps=1e-300)
# The memory a rank needs, printed by validate; a model that cannot fit, refused by bench's
# launcher before any rank starts.
epo_cli_test(validate_prints_memory 0 "^memory \\(estimate\\): [0-9.]+ GiB per rank: parameters"
             RUN validate --model tiny-moe)
epo_cli_test(bench_cannot_fit 1 "the run needs about [0-9.]+ GiB of memory" RUN
             bench --model tiny-moe -ep 2 --num_nodes 1 --gpus_per_node 2 --max_steps 3
             model.hidden_size=65536 model.num_layers=64)
# --out naming another run's directory is refused (docs/bench.md "The run directory").
epo_cli_test(bench_out_not_empty 2 "--out .*tests/cli: the directory is not empty" RUN
             bench --model tiny-moe -ep 2 --num_nodes 1 --gpus_per_node 2 --max_steps 3
             --out ${CMAKE_CURRENT_LIST_DIR})

# Messages a hostile new user gets: the closest subcommand and flag, a directory named as a
# directory, every unknown key of a file at once, JSON errors under --json, no `--config` in
# launch's help (epo train has none).
epo_cli_test(subcommand_typo 2 "unknown subcommand 'trian' \\(did you mean 'train'\\?\\)" RUN trian)
epo_cli_test(flag_typo 2 "unknown flag --max_step \\(did you mean --max_steps\\?\\)" RUN
             validate --model tiny-moe --max_step 3)
epo_cli_test(config_is_a_directory 2 "examples: is a directory, not a configuration file" RUN
             validate examples)
epo_cli_test(several_unknown_keys 2 "bad_several_unknown_keys.yaml: 3 unknown keys:" "model.hiden_size.*did you mean 'model.hidden_size'"
             "model.num_layer.*did you mean 'model.num_layers'" "train.micro_batchsize" RUN
             validate ${_epo_corpus}/bad_several_unknown_keys.yaml)
epo_cli_test(json_error_is_json 2 "^  \"error\": \\{" "\"kind\": \"usage error\"" "\"ok\": false" RUN
             validate --model no-such-recipe --json)
epo_cli_test(launch_help_no_config_flag 0 "Example: epo launch -n 4 epo train --model tiny-moe" RUN
             launch --help)
# A ratio whose calibrated link could not finish a step within comm.timeout_s is refused after
# the calibration (it held every collective for years: 1e6 calibrates to 2.8e-7 Gbit/s here).
epo_cli_test(bench_ratio_beyond_timeout 2 "--comm_compute_ratio 1000000: the link this calibrates to"
             "give a ratio of at most" RUN
             bench --model tiny-moe -ep 2 --num_nodes 2 --gpus_per_node 1 --max_steps 3
             --comm_compute_ratio 1e6 logger.log_dir=${CMAKE_BINARY_DIR}/bench-cli-runs)
# A short run of a recipe with a warm-up: TR001 says where the decay's end comes from (--max_steps)
# and how to make a short test run.
epo_cli_test(short_run_warmup 1 "TR001" "which --max_steps sets"
             "train.lr_warmup_iters=0 for a short test run" RUN
             validate --model tiny-moe --max_steps 2)
# An interleaved pipeline whose micro-batch count leaves a partial group of PP: validate names it
# (RT033) before train refuses it at the step plan.
epo_cli_test(interleaved_partial_group 0 "RT033" "train.global_batch_size = 12 \\(3 micro-batches per step, PP 2\\)" RUN
             validate --model tiny-moe -ep 2 -pp 2 -vp 2 --num_nodes 1 --gpus_per_node 4 -gb 12
             model.num_layers=4)
# Several mistyped override keys are reported at once, each with its suggestion.
epo_cli_test(overrides_all_reported 2 "2 of the overrides cannot be applied"
             "unknown key 'model.num_layrs'; did you mean 'model.num_layers'"
             "unknown key 'model.hiden_size'; did you mean 'model.hidden_size'" RUN
             validate --model tiny-moe model.num_layrs=2 model.hiden_size=3)
