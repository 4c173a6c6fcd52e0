# `epo plan` (docs/plan.md): plans of the shipped recipes on GPU clusters, the JSON shape epo
# bench's metrics.json shares, and the refusals: an invalid configuration before any planning,
# bad hardware naming the flag and the fix, a calibration for another device.
set(_epo_qwen_h100 --model qwen3-30b-a3b -ep 16 --num_nodes 2 --gpus_per_node 8 env.gpu=h100)
epo_cli_test(plan_help 0 "--inter_node_gbps" "--calibrate" RUN plan --help)
epo_cli_test(plan_h100 0 "^baseline +[0-9.]+" "^overlap\\+delay_wgrad +[0-9.]+"
             "^verdict: EP overlap pays: overlap" "400 Gbit/s between nodes" RUN
             plan ${_epo_qwen_h100})
epo_cli_test(plan_json 0 "\"runs\":" "\"name\": \"overlap\\+delay_wgrad\""
             "\"step_time_s\": [0-9.]+" "\"exposed_comm_s\"" "\"peak_memory_bytes\""
             "\"overlap_speedup\": 1\\.[0-9]+" "\"verdict\": \\{" RUN
             plan ${_epo_qwen_h100} --json)
epo_cli_test(plan_flex 0 "^flex\\+overlap\\+delay_wgrad" "as the flex dispatcher sends them" RUN
             plan ${_epo_qwen_h100} --moe_flex_dispatcher_backend hybridep)
epo_cli_test(plan_two_micro_batches 0 "2 micro-batches per step: the unpaired first forward" RUN
             plan ${_epo_qwen_h100} -gb 32)
epo_cli_test(plan_b200 0 "device b200: 2250 TFLOP/s" "7200 Gbit/s inside a node" RUN
             plan --model qwen3-30b-a3b -ep 16 --num_nodes 2 --gpus_per_node 8 env.gpu=b200)
epo_cli_test(plan_proxy 0 "set to comm/compute 1 as epo bench" "^overlap " RUN plan)
epo_cli_test(plan_invalid_config 1 "LY001" "cannot be split evenly" RUN
             plan --model qwen3-30b-a3b -ep 12 --num_nodes 2 --gpus_per_node 8 env.gpu=h100)
epo_cli_test(plan_bad_nic 1 "--inter_node_gbps=-1 is not a positive figure"
             "e.g. 400 for a 400 Gbit/s InfiniBand NIC" RUN
             plan ${_epo_qwen_h100} --inter_node_gbps -1)
epo_cli_test(plan_bad_latency 1 "--latency_us=-3" "per-collective latency" RUN
             plan ${_epo_qwen_h100} --latency_us -3)
epo_cli_test(plan_unknown_device 1 "env.gpu = 'a100'" "h100, h200, b200, gb200, cpu" RUN
             plan --model qwen3-30b-a3b -ep 16 --num_nodes 2 --gpus_per_node 8 env.gpu=a100)
epo_cli_test(plan_no_topology 1 "give --num_nodes and --gpus_per_node" RUN
             plan --model qwen3-30b-a3b -ep 16 env.gpu=h100)
# What only the epo CPU runtime lacks is one note, never a refusal; the reference's rules still
# refuse (LY005 for 94 layers over PP 8 x VPP 4 without an uneven split).
# (TP 2 with sequence parallelism turned off: the runtime's MoE layers need it, RT040.)
epo_cli_test(plan_tp 0 "TP 2, PP 1"
             "the epo runtime cannot run this configuration to check the plan on CPU \\(RT040"
             RUN plan ${_epo_qwen_h100} -tp 2 model.sequence_parallel=false)
# --json carries the same note (and the validation's warnings and notes) as the text.
epo_cli_test(plan_json_runtime_note 0 "\"can_run_on_cpu\": false" "\"RT040\""
             "\"note\": \"the epo runtime cannot run this configuration to check the plan on CPU"
             "\"validation\": \\{" RUN plan ${_epo_qwen_h100} -tp 2 model.sequence_parallel=false
             --json)
# With sequence parallelism the runtime runs it, the recipe's aux loss included (RT042 lifted).
epo_cli_test(plan_json_tp_sp_runs 0 "\"can_run_on_cpu\": true" "\"gaps\": \\[\\]" RUN
             plan ${_epo_qwen_h100} -tp 2 model.sequence_parallel=true --json)
epo_cli_test(plan_json_no_runtime_gap 0 "\"can_run_on_cpu\": true" "\"gaps\": \\[\\]"
             "\"note\": null" RUN plan ${_epo_qwen_h100} --json)
set(_epo_235b --model qwen3-235b-a22b --num_nodes 32 --gpus_per_node 8 env.gpu=h100 -tp 2
    -pp 8 -vp 4 -ep 32 model.sequence_parallel=true)
epo_cli_test(plan_uneven_pipeline 0 "TP 2, PP 8, EP 32" "pipeline: 8 stages x 4 model chunks"
             "busiest stage [0-9]+ of 8" RUN plan ${_epo_235b}
             model.account_for_embedding_in_pipeline_split=true
             model.account_for_loss_in_pipeline_split=true)
epo_cli_test(plan_ly005 1 "LY005" "account_for_embedding_in_pipeline_split" RUN
             plan ${_epo_235b})
epo_cli_test(plan_deepseek_v3 0 "pipeline: 8 stages x 4 model chunks" "MTP: 1 depth" RUN
             plan --model deepseek-v3 --num_nodes 128 --gpus_per_node 8 env.gpu=h100 -tp 2
             -pp 8 -ep 64 model.sequence_parallel=true
             "model.pipeline_model_parallel_layout=Et|(tt|)*30mL")
epo_cli_test(plan_bad_layout 1 "LY005" "holds 60 transformer layers" RUN
             plan --model deepseek-v3 --num_nodes 128 --gpus_per_node 8 env.gpu=h100 -tp 2
             -pp 8 -ep 64 model.sequence_parallel=true
             "model.pipeline_model_parallel_layout=Et|(tt|)*29t|mL")
epo_cli_test(plan_does_not_fit 0 "DOES NOT FIT" "does not fit: stage 0 needs" RUN
             plan --model qwen3-235b-a22b -ep 8 --num_nodes 1 --gpus_per_node 8 env.gpu=h100)
epo_cli_test(plan_calibrate_what 2 "--calibrate kernels\\) or from a GPU's \\(--calibrate gpu-probe"
             RUN plan --calibrate runs/x)
# A GPU's calibration from the H200 probe shipped in examples/calibration, then a plan with it.
epo_cli_test(plan_calibrate_gpu_probe 0 "h200: products 0.7[0-9] / dgrad" "wgrad 1[0-9][0-9][0-9]\\)"
             "wrote ${CMAKE_BINARY_DIR}/h200-cal.json" RUN plan --calibrate gpu-probe --probe
             ${PROJECT_SOURCE_DIR}/examples/calibration/h200-probe.json --out
             ${CMAKE_BINARY_DIR}/h200-cal.json)
epo_cli_test(plan_calibrate_gpu_probe_no_probe 2 "--calibrate gpu-probe needs --probe FILE" RUN
             plan --calibrate gpu-probe --out ${CMAKE_BINARY_DIR}/h200-cal-x.json)
epo_cli_test(plan_calibrate_probe_for_kernels 2 "--probe is read by --calibrate gpu-probe only"
             RUN plan --calibrate kernels --probe x.json --out ${CMAKE_BINARY_DIR}/cal-x.json)
epo_cli_test(plan_calibrate_gpu_probe_missing 1 "--probe /nonexistent/p.json: cannot open the file"
             RUN plan --calibrate gpu-probe --probe /nonexistent/p.json --out
             ${CMAKE_BINARY_DIR}/h200-cal-y.json)
epo_cli_test(plan_calibrate_no_out 2 "needs --out FILE" RUN plan --calibrate kernels)
epo_cli_test(plan_missing_calibration 1 "cannot open the file" RUN
             plan ${_epo_qwen_h100} --calibration /nonexistent/cal.json)
epo_cli_test(plan_expert_load 0 "expert load: 1.2 for every MoE layer" RUN
             plan ${_epo_qwen_h100} --expert_load_imbalance 1.2)
epo_cli_test(plan_bad_expert_load 2 "--expert_load_imbalance 0.5: an imbalance is at least 1"
             "give a number >= 1" RUN plan ${_epo_qwen_h100} --expert_load_imbalance 0.5)
epo_cli_test(plan_expert_load_not_a_run 2 "neither a number nor a readable file" RUN
             plan ${_epo_qwen_h100} --expert_load_imbalance /nonexistent/run)
# Bad input that used to plan, block or claim a write (each refused before any work).
epo_cli_test(plan_ratio_nan 2 "--comm_compute_ratio nan: give a positive number" RUN
             plan ${_epo_qwen_h100} --comm_compute_ratio nan)
epo_cli_test(plan_ratio_negative 2 "--comm_compute_ratio -1: give a positive number" RUN
             plan ${_epo_qwen_h100} --comm_compute_ratio -1)
epo_cli_test(plan_calibrate_out_device 2 "--out /dev/full: it is a device" RUN
             plan --calibrate kernels --out /dev/full)
epo_cli_test(plan_calibrate_out_no_dir 2 "its directory /nonexistent does not exist" RUN
             plan --calibrate kernels --out /nonexistent/cal.json)
epo_cli_test(plan_calibration_is_a_directory 2 "--calibration tests: it is a directory" RUN
             plan ${_epo_qwen_h100} --calibration tests)
epo_cli_test(plan_calibration_is_a_device 2 "--calibration /dev/null: it is a device" RUN
             plan ${_epo_qwen_h100} --calibration /dev/null)
# A bad figure inside a calibration file is blamed on the file and its field, not on the
# --peak_bf16_tflops flag the user never passed.
epo_cli_test(plan_calibration_bad_figure 2
             "calibration file tests/data/calibration-bad-peak.json: peak_bf16_tflops = -5 is outside"
             RUN plan ${_epo_qwen_h100} --calibration tests/data/calibration-bad-peak.json)
