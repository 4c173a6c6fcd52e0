// The cost of one node call (docs/plan.md "How it predicts"): what the call does, from the model
// shape and the layout (its matrix products, the bytes its element-wise work touches, the bytes
// its collectives move on each link), and how long that takes on the hardware.
//
//   compute  t = sum over products of 2 m n k / (peak * eff_p(min(m, n, k)))
//              + kernel bytes / (memory bandwidth * elementwise_efficiency)
//              + streaming bytes / (memory bandwidth * memory_efficiency)
//              + node_overhead_us
//            eff_p(x) = e_p * x / (x + h_p)   (small products run slower), e_p the
//            pass's efficiency: gemm_efficiency for forward products, dgrad_efficiency for input
//            gradients (and core attention's backward), wgrad_efficiency for weight gradients
//            (their layouts differ: on a CPU the weight gradient's transposed, f32-accumulating
//            product is the slowest); h_p gemm_half_dim, or wgrad_half_dim for weight
//            gradients, whose small dimension is their reduction (the tokens): each f32 gradient
//            element is read and written once per call however few tokens add to it, so on a GPU
//            they need ~10x as many tokens for half their peak (epo-gpu-probe on an H200)
//   comm     t = the link model's (comm/link_model.h) time of the call's intra- and inter-node
//              bytes at link_efficiency x the nominal bandwidths, + one latency per collective
//   overlap  a call that runs while the other stream is busy takes
//              t * (1 + overlap_slowdown * the other stream's busy share of its span)
//            (plan.h applies it): compute and communication kernels share the GPU's SMs and
//            memory. Default from the SMs the communication kernels hold: s = n / (SMs - n),
//            n = 32 for NCCL's all-to-all (its default maximum of 32 channels, one block each),
//            24 for flex (DeepEP's default of 24 SMs); on cpu 0 (the link model's waiting thread
//            sleeps)
//
// Work per micro-batch and rank (letters as in model/gpt_model.h; T tokens, R = T k routed rows;
// the busiest EP rank of a MoE layer receives f R rows, f the layer's expert load imbalance
// (expert_load.h, 1 for balanced routing), each of its local experts f R / E_local: the
// all-to-alls end together on every rank, so the step runs at that rank's pace):
//   pre_dispatch  qkv (T, W, H), proj (T, H, A d), router (T, E, H); core attention B A times
//                 (S, S, d) and (S, d, S) at the device's attention_fraction; element-wise: norms,
//                 q/k preparation, softmax over the scores, the routed rows' permutation
//   mlp           MoE: E_local x [(fR/E_local, 2F, H), (fR/E_local, H, F)]; dense
//                 (T, 2F, H), (T, H, F); element-wise: activation, sort and unpermute
//   output        (T, V, H); element-wise: final norm, softmax and loss over (T, V)
//   dispatch      the count exchange and the rows (H c + 4 bytes each: row and probability) to
//                 the other EP ranks: f R (EP-1)/EP rows (the busiest rank's), split by node;
//                 combine: the rows back (H c); backward: the same bytes the other way
//   flex          (docs/flex.md) a token crosses to each other node once: (N-1)(1 - C(E-E/N, k) /
//                 C(E, k)) inter-node copies per token, then fans out inside the node
//   grad_reduce   a bucket's fp32 gradients over the data-parallel group: reduce-scatter
//                 (distributed optimizer) sends bytes (G-1)/G, all-reduce twice that
//   param_gather  the bucket's parameters in the compute dtype, all-gather: bytes (G-1)/G
// A backward computes twice the forward's products (input and weight gradients) and touches
// twice its element-wise bytes; with delayed weight gradients the backward keeps the input
// gradients (weights' products once, core attention twice) and backward_dw the rest.
//
// Megatron-Core's layout (Tc = T / CP tokens of this rank's sequence chunk, Ts = Tc / TP with
// sequence parallelism, else Tc):
//   TP       every dense product's output (or inner) width / TP, core attention's heads / TP;
//            per layer a gather before and a reduce-scatter after attention and after a dense MLP
//            or shared expert (one all-reduce each without SP), each (TP-1)/TP Tc H c bytes on the
//            node's links, on the compute call (the compute stream waits for them); with
//            tp_comm_overlap only what outlasts the call's products
//   CP       queries Sc = S / CP against all S keys; the other CP ranks' keys and values
//            ((CP-1) Tc 2 G d / TP c bytes, twice in the backward) on the attention call
//   ETP      the rows a rank receives all-gathered over ETP (combine: reduce-scattered), (ETP-1)
//            R H c more bytes inside the node; each expert product R ETP rows of F / ETP
//   PP       a stage's calls (pipeline_schedule.h), its hand-offs Ts H c between stages
//   MLA      (attention_work in cost_model.cpp): compressed q and kv, rope and non-rope parts
//   recompute  full: the schedule's recompute calls (Phase::kRecompute, before a recomputed
//            group's last backward), each costed as its forward node, collectives included;
//            the backward first runs again: selective, per
//            module of recompute_modules: core_attn the score and context products, layernorm the
//            norms' element-wise bytes, mla_up_proj MLA's up projections, moe_act the experts'
//            activation bytes, moe or mlp the MLP's forward, shared_experts the shared expert
//   fp8      every weight product at the device's fp8 rate but the router's and the output
//            layer's (Gemm::keeps_bf16); its input cast to fp8 first (read c,
//            write 1 byte an element: the activation in the forward, the output gradient in the
//            backward; the weights' casts are cached across micro-batches); with flex the
//            dispatch sends rows in fp8 with one fp32 scale per 128 elements, H + H / 32 + 4
//            bytes a row (the combine and the backward stay bf16), as DeepEP and HybridEP do
//   graphs   a compute call's launch cost is node_overhead_us; the share its graphed modules
//            cover is replaced by one graph_launch_us (pre_dispatch: attention 0.6, the router
//            0.2, the permutation 0.2; mlp: all of it for mlp / moe)
//   host     the host launches every call one after another: an overlap schedule takes at
//            least the sum of every compute call's launch cost and comm_launch_us per
//            communication call (plan.cpp); a GPU fast enough makes that the step
//   MTP      each depth: one layer like the last, the model's last position (its own calls in
//            the step plan), its pre_dispatch with the shifted tokens' embedding lookup, enorm,
//            hnorm and the projection (Tc, H, 2H); an output head and loss on the output call
//
// Deliberately not modelled: load
// imbalance between the experts of one rank (only the ranks' totals count) or between the
// micro-batches of a step, kernel fusion beyond what the byte counts say.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "epo/comm/link_model.h"
#include "epo/config/config.h"
#include "epo/model/gpt_model.h"
#include "epo/plan/expert_load.h"
#include "epo/plan/hardware.h"
#include "epo/schedule/schedule.h"
#include "epo/train/step_plan.h"

namespace epo::plan {

// The efficiency parameters (the calibration). Defaults per device family: default_params().
struct CostParams {
    double gemm_efficiency = 0.7;    // share of peak a large forward product reaches
    double dgrad_efficiency = 0.7;   // ... an input-gradient product
    double wgrad_efficiency = 0.7;   // ... a weight-gradient product
    double gemm_half_dim = 64;       // smallest product dimension at which it reaches half that
    double wgrad_half_dim = 64;      // ... for a weight-gradient product (its token count)
    double memory_efficiency = 0.7;  // share of memory bandwidth streaming loops reach (Adam)
    // ... element-wise kernels reach (norms, softmax, activation, permutations: on a CPU their
    // exp() and gathers keep them well below a streaming loop)
    double elementwise_efficiency = 0.7;
    double link_efficiency = 0.8;      // share of nominal link bandwidth a collective reaches
    double overlap_slowdown = 0;       // alltoall: a call slows by this while the other stream runs
    double flex_overlap_slowdown = 0;  // the same with the flex dispatcher's kernels
    double node_overhead_us = 0;       // fixed cost of every compute node call
    // The host's launch cost of a communication call (its kernels, event record and wait): the
    // overlap schedules cannot finish before the host has launched every call of the step.
    double comm_launch_us = 0;
    double graph_launch_us = 0;  // a CUDA graph's replay, instead of its kernels' launches
    std::string source;          // "defaults for h100", "calibration FILE", ...
};

// The figures docs/plan.md states for each family.
CostParams default_params(const DeviceSpec& device);

enum class GemmPass { kForward, kDgrad, kWgrad };

struct Gemm {
    double m = 0, n = 0, k = 0;
    double count = 1;
    GemmPass pass = GemmPass::kForward;
    bool fp8 = false;  // at the device's fp8 rate (model.fp8: the weight products)
    // Never fp8: the router and the output layer, which Megatron-Core runs outside Transformer
    // Engine (the router in moe_router_dtype, the output layer a plain column-parallel linear).
    bool keeps_bf16 = false;
};

// What one call does.
struct NodeWork {
    std::vector<Gemm> gemms;
    // Of the compute call's launch cost (node_overhead_us): the share its CUDA graphs replace
    // with one graph launch (model.cuda_graph_modules).
    double graphed_share = 0;
    double elementwise_bytes = 0;  // element-wise kernels
    double stream_bytes = 0;       // streaming loops
    comm::ByteCounts bytes;        // per rank (the busiest, for the all-to-alls)
    int num_collectives = 0;
    // Collectives the compute stream waits for inside a compute call (tensor- and
    // context-parallel all-gathers, reduce-scatters, all-reduces), per rank.
    comm::ByteCounts serial_bytes;
    int num_serial_collectives = 0;
    double tp_bytes = 0;  // of serial_bytes: the TP group's, sent by this rank
};

// Everything a call's work depends on, from the finalized configuration and its step plan.
struct PlanModel {
    model::GptShape shape;      // EP rank 0 (every rank alike, but for the expert load)
    int64_t compute_bytes = 2;  // c: bytes of the compute dtype
    // Bytes of a gradient element (main_grad): 4, or c with ddp.grad_reduce_in_fp32 false.
    int64_t grad_bytes = 4;
    int ep_size = 1;
    int ep_ranks_per_node = 1;  // EP ranks that share a node
    int num_nodes = 1;
    bool flex = false;  // deduplicated dispatch (docs/flex.md)
    double attention_fraction = 0.5;
    bool fused_attention = true;
    int dp_size = 1, edp_size = 1;
    bool dp_crosses_nodes = false, edp_crosses_nodes = false;
    // Megatron-Core's layout: TP with or without sequence parallelism, CP, the experts' TP.
    int tp_size = 1, cp_size = 1, etp_size = 1;
    bool sequence_parallel = false;
    bool tp_comm_overlap = false;  // TP collectives hidden under the GEMMs (latency stays)
    // Bytes an element of the TP reductions and of every backward TP collective: the compute
    // dtype in Megatron-Core (bf16 activations and their gradients); 4 in the epo runtime
    // (env.gpu=cpu), whose sums and gradients are fp32 (model/tensor_parallel.h).
    double tp_reduce_bytes = 2;
    // TP as the epo runtime runs it (env.gpu=cpu) rather than as Megatron-Core does: the shared
    // expert whole on the rank's Ts rows without collectives (Megatron-Core splits it over TP,
    // a gather before it and a reduce-scatter after), the cross-entropy's maxima all-gathered
    // (Megatron-Core all-reduces them).
    bool epo_runtime_tp = false;
    // Gradient elements the TP group sums before the data-parallel reduction (Megatron-Core's
    // finalize_model_grads: the parameters replicated over TP that see the rank's own rows or
    // heads); 0 at TP 1.
    double tp_summed_elements = 0;
    bool tp_crosses_nodes = false, cp_crosses_nodes = false, pp_crosses_nodes = false;
    // Multi-latent attention (model.multi_latent_attention): the ranks and head parts.
    bool mla = false;
    double q_lora_rank = 0, kv_lora_rank = 0, qk_head_dim = 0, qk_pos_emb_head_dim = 0,
           v_head_dim = 0;
    int mtp_num_layers = 0;  // multi-token prediction depths, on the last stage
    bool fp8 = false;        // model.fp8: weight products at the fp8 rate, their inputs cast
    // Graphed modules (model.cuda_graph_impl / cuda_graph_modules): attention, the router and
    // the permutation before the dispatch, the dense MLP, the experts.
    bool graph_attn = false, graph_router = false, graph_preprocess = false, graph_mlp = false,
         graph_moe = false;
    // Activation recompute: what the backward of a layer's calls runs again first.
    std::optional<config::RecomputeGranularity> recompute_granularity;
    std::vector<config::RecomputeModule> recompute_modules;  // selective
    bool recompute_block = false;  // full: the first recompute_num_layers of each model chunk
    int recompute_num_layers = 1;
    int layers_per_chunk = 1;  // L / (PP VPP)
    bool distributed_optimizer = false;
    // [L]: the busiest EP rank's routed rows over the mean (1 for dense layers).
    std::vector<double> load_imbalance;
    // Per bucket of the step plan: the fp32 gradient bytes of its dense and expert parameters.
    std::vector<int64_t> bucket_dense_bytes, bucket_expert_bytes;
};

// `plan` is make_step_plan's for `cfg` (any schedule: the buckets are the same), of pipeline
// stage `pipeline_rank`.
PlanModel make_plan_model(const config::Config& cfg, const train::StepPlan& plan,
                          const DeviceSpec& device, bool flex, const ExpertLoadImbalance& load = {},
                          int pipeline_rank = 0);

NodeWork node_work(const PlanModel& model, const schedule::NodeCall& call);

double compute_seconds(const NodeWork& work, const DeviceSpec& device, const CostParams& params);
// The host's launch cost of a compute call (node_overhead_us, less what CUDA graphs replace).
double launch_seconds(const NodeWork& work, const CostParams& params);
double comm_seconds(const NodeWork& work, const NetworkSpec& network, const CostParams& params);
// The compute call's TP / CP collectives (serial_bytes) on their links.
double serial_comm_seconds(const NodeWork& work, const NetworkSpec& network,
                           const CostParams& params);
// Either, by the call's stream.
double call_seconds(const PlanModel& model, const schedule::NodeCall& call, const Hardware& hw,
                    const CostParams& params);

// Inter-node copies per token under per-node deduplication: (N-1)(1 - C(E-E/N, k)/C(E, k)).
double flex_remote_copies(int64_t num_experts, int64_t top_k, int num_nodes);

// The optimizer step (after every call, on the compute stream): Adam over this rank's shard,
// the reductions the schedule did not bucket, the TP group's sums of replicated gradients, the
// embedding group's sum of the embedding copies' gradients, the loss and grad-norm all-reduces.
struct OptimizerWork {
    double elementwise_bytes = 0;
    NodeWork collectives;
    double tp_bytes = 0;  // of collectives: the TP group's gradient sums, sent by this rank
    // Of collectives: the embedding group's sum of the word embedding copies' gradients.
    double embedding_bytes = 0;
};
OptimizerWork optimizer_work(const PlanModel& model, const train::StepPlan& plan);

}  // namespace epo::plan
