# Flags as Megatron-Bridge and Megatron-LM users spell them: each harness flag of
# scripts/performance's argument parser and each Megatron-LM alias (harness.cpp megatron_flags)
# is applied and found in the printed configuration; unknown flags are answered in the
# vocabulary the user is typing.

# The reference harness's launch and precision flags.
epo_cli_test(bridge_num_gpus_h100 0 "^  num_nodes: 2$" "^  gpus_per_node: 8$" "^  gpu: h100$" RUN
             validate --model qwen3-30b-a3b -ng 16 -g h100 -ep 8)
epo_cli_test(bridge_num_gpus_long_names_gb200 0 "^  num_nodes: 4$" "^  gpus_per_node: 4$" RUN
             validate --model qwen3-30b-a3b --num_gpus 16 --gpu gb200 -ep 8)
epo_cli_test(bridge_gpus_per_node_short 0 "^  num_nodes: 4$" "^  gpus_per_node: 4$" RUN
             validate --model qwen3-30b-a3b -ng 16 -g h100 -gn 4 -ep 8)
epo_cli_test(bridge_num_gpus_part_node 2 "ceil\\(12 / 8\\) = 2 nodes, 16 ranks" RUN
             validate --model qwen3-30b-a3b -ng 12 -g h100)
epo_cli_test(bridge_gpu_unknown 2 "-g/--gpu 'vr200' is not a GPU EPO knows" RUN
             validate --model qwen3-30b-a3b -g vr200)
epo_cli_test(bridge_compute_dtype_bf16 0 "^  bf16: true$" RUN
             validate --model tiny-moe -c bf16)
epo_cli_test(bridge_compute_dtype_long 0 "^  bf16: true$" RUN
             validate --model tiny-moe --compute_dtype bf16)
epo_cli_test(bridge_compute_dtype_fp8 0 "^  fp8: hybrid$" "^  fp8_recipe: tensorwise$" RUN
             validate --model qwen3-30b-a3b -c fp8_cs env.gpu=h100)
epo_cli_test(bridge_compute_dtype_fp4_refused 2 "nvfp4 selects Bridge's bf16_with_nvfp4_mixed"
             "use -c bf16" RUN validate --model qwen3-30b-a3b -c nvfp4)
epo_cli_test(bridge_expert_tensor_short_et 0 "^  expert_tensor_parallel_size: 2$" RUN
             validate --model qwen3-30b-a3b -et 2)
epo_cli_test(bridge_max_steps_short_ms 0 "^  train_iters: 7$" RUN
             validate --model tiny-moe -ms 7)
epo_cli_test(bridge_vp_minus_one_keeps_the_config 0
             "^  virtual_pipeline_model_parallel_size: 2$" RUN
             validate tests/data/vpp2.yaml -vp -1)
epo_cli_test(bridge_vp_none 0 "^  virtual_pipeline_model_parallel_size: null$" RUN
             validate tests/data/vpp2.yaml -vp None)
epo_cli_test(bridge_recompute_num_layers_rl 0 "^  recompute_granularity: full$"
             "^  recompute_method: block$" "^  recompute_num_layers: 2$" RUN
             validate --model qwen3-30b-a3b -rl 2)
epo_cli_test(bridge_recompute_modules 0 "^  recompute_granularity: selective$"
             "^  recompute_modules: \\[core_attn, moe_act\\]$" RUN
             validate --model qwen3-30b-a3b --recompute_modules core_attn,moe_act)
epo_cli_test(bridge_cuda_graph 0 "^  cuda_graph_impl: transformer_engine$"
             "^  cuda_graph_modules: \\[attn, moe_router\\]$" RUN
             validate --model qwen3-30b-a3b --cuda_graph_impl transformer_engine
             --cuda_graph_scope attn,moe_router)
epo_cli_test(bridge_cuda_graph_scope_needs_impl 2 "needs a CUDA-graph implementation" RUN
             validate --model qwen3-30b-a3b --cuda_graph_scope attn)

epo_cli_test(bridge_model_recipe_name 0 "^recipe: qwen3-30b-a3b$" RUN
             validate -m qwen -mr qwen3_30b_a3b -ng 16 -g h100 -ep 16)
epo_cli_test(bridge_model_recipe_long_names 0 "^recipe: deepseek-v3$" RUN
             validate --model_family_name deepseek --model_recipe_name deepseek_v3)
epo_cli_test(bridge_model_family_mismatch 2 "-m/--model_family_name deepseek is not the family" RUN
             validate -m deepseek -mr qwen3_30b_a3b)
epo_cli_test(bridge_model_recipe_unknown 2 "EPO has no recipe llama31-405b; its recipes: " RUN
             validate -m llama -mr llama31_405b)
epo_cli_test(bridge_model_family_alone 2 "needs -mr/--model_recipe_name" RUN validate -m qwen)

# Unknown flags: the suggestion comes from the vocabulary typed.
epo_cli_test(suggest_short_for_short 2 "unknown flag -ngg \\(did you mean -ng\\?\\)" RUN
             validate --model tiny-moe -ngg 4)
epo_cli_test(suggest_long_for_long 2 "unknown flag --num_gpu \\(did you mean --num_gpus\\?\\)" RUN
             validate --model tiny-moe --num_gpu 4)
epo_cli_test(suggest_dashed_for_dashed 2
             "unknown flag --expert-model-paralel-size \\(did you mean --expert-model-parallel-size\\?\\)"
             RUN validate --model tiny-moe --expert-model-paralel-size 4)
epo_cli_test(suggest_dashed_num_layers 2
             "unknown flag --num-layer \\(did you mean --num-layers\\?\\)" RUN
             validate --model tiny-moe --num-layer 4)

# Megatron-LM's flags: FLAG|VALUE|the line of the printed configuration it gives.
set(_epo_megatron_aliases
    "--tensor-model-parallel-size|2|  tensor_model_parallel_size: 2"
    "--pipeline-model-parallel-size|4|  pipeline_model_parallel_size: 4"
    "--num-virtual-stages-per-pipeline-rank|3|  virtual_pipeline_model_parallel_size: 3"
    "--context-parallel-size|2|  context_parallel_size: 2"
    "--expert-model-parallel-size|8|  expert_model_parallel_size: 8"
    "--expert-tensor-parallel-size|2|  expert_tensor_parallel_size: 2"
    "--sequence-parallel||  sequence_parallel: true"
    "--num-layers|24|  num_layers: 24"
    "--hidden-size|1024|  hidden_size: 1024"
    "--ffn-hidden-size|4096|  ffn_hidden_size: 4096"
    "--num-attention-heads|16|  num_attention_heads: 16"
    "--num-query-groups|2|  num_query_groups: 2"
    "--kv-channels|64|  kv_channels: 64"
    "--seq-length|2048|  seq_length: 2048"
    "--num-experts|64|  num_moe_experts: 64"
    "--moe-ffn-hidden-size|512|  moe_ffn_hidden_size: 512"
    "--moe-shared-expert-intermediate-size|768|  moe_shared_expert_intermediate_size: 768"
    "--moe-router-topk|4|  moe_router_topk: 4"
    "--moe-router-score-function|sigmoid|  moe_router_score_function: sigmoid"
    "--moe-router-pre-softmax||  moe_router_pre_softmax: true"
    "--moe-router-num-groups|8|  moe_router_num_groups: 8"
    "--moe-router-group-topk|4|  moe_router_group_topk: 4"
    "--moe-router-load-balancing-type|seq_aux_loss|  moe_router_load_balancing_type: seq_aux_loss"
    "--moe-aux-loss-coeff|0.01|  moe_aux_loss_coeff: 0.01"
    "--moe-expert-capacity-factor|1.5|  moe_expert_capacity_factor: 1.5"
    "--moe-token-dispatcher-type|allgather|  moe_token_dispatcher_type: allgather"
    "--moe-permute-fusion||  moe_permute_fusion: true"
    "--moe-shared-expert-overlap||  moe_shared_expert_overlap: true"
    "--overlap-moe-expert-parallel-comm||  overlap_moe_expert_parallel_comm: true"
    "--delay-wgrad-compute||  delay_wgrad_compute: true"
    "--recompute-granularity|selective|  recompute_granularity: selective"
    "--recompute-method|uniform|  recompute_method: uniform"
    "--recompute-num-layers|2|  recompute_num_layers: 2"
    "--mtp-num-layers|1|  mtp_num_layers: 1"
    "--bf16||  bf16: true"
    "--micro-batch-size|2|  micro_batch_size: 2"
    "--global-batch-size|512|  global_batch_size: 512"
    "--train-iters|9|  train_iters: 9")
foreach(_alias ${_epo_megatron_aliases})
  string(REPLACE "|" ";" _parts "${_alias}")
  list(GET _parts 0 _flag)
  list(GET _parts 1 _value)
  list(GET _parts 2 _line)
  string(REGEX REPLACE "^--" "" _name "${_flag}")
  # The status is not checked here (a single flag may well make the model invalid, e.g. EP
  # overlap without EP): the flag was taken, and the printed configuration carries its value.
  add_test(NAME cli.megatron_alias.${_name}
           COMMAND bash -c "out=$(\"$0\" validate --model qwen3-30b-a3b \"$@\" 2>&1); s=$?; [ $s -le 1 ] && grep -qxF -- \"${_line}\" <<<\"$out\" || { echo \"status $s\"; echo \"$out\"; exit 1; }"
                   $<TARGET_FILE:epo_cli> ${_flag} ${_value})
  set_tests_properties(cli.megatron_alias.${_name} PROPERTIES LABELS cli TIMEOUT 60)
endforeach()
epo_cli_test(megatron_layers_per_virtual_stage 0 "^  virtual_pipeline_model_parallel_size: 4$" RUN
             validate --model qwen3-30b-a3b --pipeline-model-parallel-size 4
             --num-layers-per-virtual-pipeline-stage 3)
# Megatron-LM's TP flag sets TP only; the harness's -tp also turns on sequence parallelism.
epo_cli_test(megatron_tp_leaves_sequence_parallel 0 "^  sequence_parallel: false$" RUN
             validate --model qwen3-30b-a3b --tensor-model-parallel-size 2)
epo_cli_test(harness_tp_sets_sequence_parallel 0 "^  sequence_parallel: true$" RUN
             validate --model qwen3-30b-a3b -tp 2)

# Megatron-Bridge run_config.yaml files as Bridge writes them (tests/data): read with no edits.
epo_cli_test(bridge_file_qwen3_validates 0 "VALID: 0 errors"
             "Megatron-Bridge keys EPO does not use \\(read, not applied; [0-9]+ in all\\): checkpoint\\.\\*"
             "^  expert_model_parallel_size: 16$" "^  activation_func: silu$" RUN
             validate tests/data/bridge-qwen3-30b-a3b-run_config.yaml -ng 16 -g h100)
epo_cli_test(bridge_file_qwen3_plans 0 "^overlap " "verdict:" RUN
             plan tests/data/bridge-qwen3-30b-a3b-run_config.yaml -ng 16 -g h100)
epo_cli_test(bridge_file_deepseek_validates 0 "VALID: 0 errors"
             "pipeline_model_parallel_layout: Etttttttt\\|" RUN
             validate tests/data/bridge-deepseek-v3-run_config.yaml -ng 256 -g h100)
epo_cli_test(bridge_file_deepseek_plans 0 "^baseline +[0-9.]+" "^verdict: EP overlap" RUN
             plan tests/data/bridge-deepseek-v3-run_config.yaml -ng 256 -g h100)
epo_cli_test(bridge_section_in_own_layout 2 "'rng' is a Megatron-Bridge section" RUN
             validate --model tiny-moe rng.seed=3)
# A Megatron-LM checkpoint's arguments dump, read with Megatron-LM's names.
epo_cli_test(megatron_args_dump_validates 0 "VALID: 0 errors"
             "Megatron-LM arguments EPO does not use \\(read, not applied; [0-9]+ in all\\)"
             "^  num_moe_experts: 128$" "^  activation_func: silu$" RUN
             validate tests/data/megatron-args-qwen3-30b-a3b.yaml -ng 16 -g h100)
