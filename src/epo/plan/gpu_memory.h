// The memory one GPU rank of a Megatron-Core run holds, per pipeline stage, before anything runs:
// what `epo plan` checks each schedule against the device's capacity with (the CPU runtime's own
// layout, config/memory_estimate.h, stays the estimate for env.gpu=cpu).
//
// Per rank (P_d dense and P_e expert parameter elements of the stage: dense split over TP, the
// experts' over EP x ETP; DP = world / (TP PP CP), EDP = world / (ETP EP PP)):
//   weights     c (P_d + P_e)                    c = 2 in bf16 (4 in fp32)
//   main grads  4 (P_d + P_e)                    fp32, as Megatron's DDP keeps them
//   optimizer   12 (P_d / DP + P_e / EDP)        fp32 master + Adam m, v, sharded by the
//                                                distributed optimizer (12 (P_d + P_e) without
//                                                it; 8 in fp32 training, the master is the weight)
//   fp8 weights f P_g                            with fp8 (model.fp8): Transformer Engine casts
//                                                each product's weight once per step and keeps
//                                                the cast for every micro-batch: a row-wise copy
//                                                for the forward and a column-wise (transposed)
//                                                one for the input gradient, 1 byte an element
//                                                each, f = 2 (delayed, tensorwise, blockwise;
//                                                their scales are a few per tensor or per 128 x
//                                                128 block); MXFP8 adds a 1-byte scale per 32
//                                                elements to each copy, f = 2 (1 + 1/32). P_g:
//                                                the weights of the layers' products (attention
//                                                projections, MLP, experts, shared expert, MTP's
//                                                layer and projection), not the router, norms,
//                                                embedding or output layer, which stay bf16.
//                                                The bf16 weights stay beside them.
// Activations of one layer and micro-batch (s = S / CP, b = micro batch, h hidden, t = TP;
// n_sp = s b / t tokens with sequence parallelism, else s b; all 2 bytes but the router's):
//   norms' inputs         4 n_sp h
//   projections' inputs   2 n_sp h (attention)  + 2 n_sp h (MLP or router)   [not held with
//                                                                  recompute_modules layernorm]
//   attention             GQA: 2 s b (A d + G d + G d + A d) / t (q, k, v, context: flash
//                         attention holds no scores); MLA: q, k of width dn + dr, v and context
//                         of dv per head, / t, plus the compressed 2 s b (q_lora + kv_lora + dr)
//                         [mla_up_proj: only the compressed parts]
//   dense MLP             2 s b (f1 + F) / t      f1 = 2F gated, else F      [mlp: none]
//   MoE                   router 8 n_sp E (fp32 logits and probabilities); R = n_sp k routed rows
//                         (balanced), gathered over ETP: R ETP rows of F / ETP at the rank's
//                         experts; their input 2 R ETP h, f1 output 2 R f1 F, the activation's
//                         output 2 R F [moe_act: not held], the experts' output after the ETP
//                         reduce-scatter 2 R h for the combine's probability gradient
//                         [moe: none];
//                         shared expert 2 s b (f1s + Fs) / t  [shared_experts: none]
// This is Megatron's theoretical_memory_usage count (18 + 4 F / h) s b h / t per layer with SP,
// (10 + 24 / t) s b h without, less the dropout masks (2 s b h: the reference recipes train
// without dropout, and the configuration has no dropout field), generalized to GQA, gating, MoE
// and MLA.
//   full recompute        uniform: each group of recompute_num_layers layers holds its input
//                         2 n_sp h; block: the first recompute_num_layers layers of each model
//                         chunk hold only their input; plus, transient, one group's activations
//                         during its recomputation
// Per stage: the layers it holds times the micro-batches in flight, the interleaved 1F1B warm-up
// of Megatron-Core's interleaved 1F1B: min(M V, W_s + 1) (model-chunk, micro-batch) units,
// W_s = P - s - 1 (V = 1), 2 (P - s - 1) + (V - 1) P (V > 1). EP overlap's combined step runs
// layer j's forward of one micro-batch beside layer L-1-j's backward of another, so as one
// frees a layer the other takes one: one layer more than the baseline at the peak (paired edges:
// the first two forwards run together, two whole units). Delayed weight gradients hold one
// layer's output gradients until backward_dw (counted as one layer's activations). Stage 0 adds the
// token ids (8 s b per micro-batch in flight); the last stage the output layer (final norm 4 n_sp h
// and fp32 logits 4 s b V / t of one micro-batch) and the multi-token-prediction layers (each like
// the last layer, plus its 2 s b h / t projection input and its own logits).
//
// Deliberately not modelled: the CUDA context, NCCL's and DeepEP's buffers and allocator
// fragmentation (the plan keeps a headroom for them), fp8 primary weights (fp8_param_gather,
// which the configuration does not take), activations saved in fp8 (counted at 2 bytes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "epo/config/config.h"

namespace epo::plan {

// Bytes of an element of the compute dtype (bf16 / fp16: 2, else 4), and of a main gradient
// (fp32, or the compute dtype with ddp.grad_reduce_in_fp32 false): the memory model's and the
// cost model's one rule.
inline int compute_dtype_bytes(const config::ModelConfig& m) {
    return m.bf16 || m.fp16 ? 2 : 4;
}
inline int main_grad_bytes(const config::Config& cfg) {
    return cfg.ddp.grad_reduce_in_fp32 ? 4 : compute_dtype_bytes(cfg.model);
}

struct StageMemory {
    int stage = 0;
    int num_layers = 0;          // transformer layers on the stage, every model chunk
    double weights = 0;          // bytes
    double main_grads = 0;       // bytes
    double optimizer = 0;        // bytes
    double fp8_weights = 0;      // bytes: the fp8 copies of the product weights (fp8 on)
    double activations = 0;      // bytes held for the backward at the peak
    double units_in_flight = 0;  // (model chunk, micro-batch) units held at the peak
    double overlap_extra = 0;    // of activations: what EP overlap / delayed wgrad add
    double total() const { return weights + main_grads + optimizer + fp8_weights + activations; }
};

struct GpuMemory {
    std::vector<StageMemory> stages;  // one per pipeline stage
    int busiest_stage = 0;            // the stage with the largest total
    double peak() const { return stages.at(static_cast<size_t>(busiest_stage)).total(); }
};

// The schedule the flags of `cfg` select (model.overlap_moe_expert_parallel_comm,
// delay_wgrad_compute, moe_ep_overlap_pair_edges). `cfg` finalized, topology stated.
GpuMemory estimate_gpu_memory(const config::Config& cfg);

// One layer's activations for one micro-batch as held for the backward, bytes (the table above;
// full recompute not applied).
double layer_activation_bytes(const config::Config& cfg, bool moe_layer);
// One layer's parameter elements on a rank (dense split over TP, experts over EP x ETP).
struct LayerParams {
    double dense = 0, expert = 0;
    double gemm_dense = 0;  // of dense: the products' weights (no norms, biases or router)
};
// Bytes per product weight element that fp8 adds (the table above): 0 without fp8.
double fp8_weight_copy_bytes(const config::ModelConfig& m);
LayerParams layer_params(const config::ModelConfig& m, bool moe_layer);

}  // namespace epo::plan
