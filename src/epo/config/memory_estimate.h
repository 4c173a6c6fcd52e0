// How much memory one rank of a run needs, from the finalized configuration alone, so that a run
// that cannot fit the machine is refused before anything is allocated (a model.hidden_size of
// 65536 used to validate and then die in std::bad_alloc, or take the host down without a limit).
//
// What a rank holds (docs/runtime.md "Memory"), in bytes; c = bytes of the compute dtype (2 in
// bf16, 4 in fp32), P_d / P_e = this rank's dense / expert parameter elements:
//
//   parameters   P * (4 master + c compute)         (in fp32 the compute copy is the master: +0)
//   gradients    P * 4                              (fp32 main_grad)
//   optimizer    P_d * 8 / DP_d + P_e * 8 / DP_e    (Adam m, v; each divided by its data-parallel
//                                                    group when the optimizer is distributed)
//   packed       P_e * 2c                           (oneDNN-blocked expert weights, one copy for
//                                                    the forward, one for the input gradient)
//   activations  in_flight * (L * (fwd + bwd) + output + 8TH)
//                in_flight = 2 micro-batches for the overlap schedule (3 with paired edges and
//                3 or more micro-batches per step: schedule.h), 1 for the baseline; every
//                layer state's arena keeps the capacity of its forward and backward tensors
//                (fwd, bwd below), the output state its own, and 8TH the two f32 gradient buffers
//   scratch      the compute stream's largest node: 4TW + cT(Ad) + (4 + c) S^2 + 8TH
//                (attention backward's f32 q/k/v gradients, its context gradient, one sequence's
//                score and probability gradients, and the layer's two f32 (T, H) temporaries)
//   runtime      kRuntimeBaseBytes: libraries, MPI's shared-memory segments, OpenMP, oneDNN
//
// Per micro-batch and layer (T tokens, B = micro_batch_size sequences of S, H hidden, A heads, G
// key-value groups of width d, W = (A + 2G) d, E experts, k = top-k, R = T k routed rows, f1 = 2F
// for a gated MLP of width F else F):
//   fwd = 4TH x + 4TH h + 2cTH (n1, n2) + 8T rstd + cT(W + Ad) q,k,v,ctx + cBAS^2 probs
//         MoE: 8TE + 12Tk router + 6cRH dispatch buffers + cR(f1 + F) experts
//              [+ cT(f1s + Fs) + 4TH shared expert]     dense: cT(f1 + F)
//         multi-latent attention replaces cT(W + Ad) + cBAS^2 (and the qk-norm term) with what
//         model/mla_attention.h's mla_saved_bytes counts: c T (Rq [+ Rq] + Rkv [+ Rkv]
//         + 2 A Dq + 2 A Dv) + 4T per norm + cBAS^2 (Dq = qk_head_dim + qk_pos_emb_head_dim)
//   bwd = cTH dout + cTW dqkv + cTH d_out_c + 4TH dn2
//         MLA: cTW is replaced by cT(A Dq + A (Dn + Dv) + Rkv + Dr [+ Rq])
//         MoE: 6TE router + 5cRH dispatch gradients + cR f1 [+ cT f1s]   dense: cT f1
//   output = 4TH x + cTH normed + 4T + cTV dlogits + 4TH d_normed
// Full recompute (recompute_granularity full): layers_activation_bytes below.
// Selective recompute (recompute_modules) takes out of fwd what it does not keep and puts it in
// the scratch of the node that recomputes it (an upper bound: the modules' recomputed tensors
// added up, though they live in different nodes):
//   layernorm 2cTH (n1, n2)   core_attn cBAS^2 (probs; scratch (c + 4) S^2, one head's P and
//   scores)   moe_act cRF   mlp cT(f1 + F) (dense layers)   shared_experts cT(f1s + Fs)
// Received rows are taken as R (uniform routing); expert-row padding (32 rows per expert) is
// left out. Measured against the peak RSS (VmHWM) of real runs, docs/runtime.md "Memory".
//
// Deliberately not modelled: the dataset (mock data is generated per step), the trace records
// (only with --trace), allocator fragmentation.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "epo/config/config.h"

namespace epo::config {

// Measured: a 2-rank tiny job with a 1-layer, hidden-64 model peaks at 37 MB per rank.
inline constexpr int64_t kRuntimeBaseBytes = 40'000'000;

struct MemoryEstimate {
    int64_t parameters = 0;
    int64_t gradients = 0;
    int64_t optimizer = 0;
    int64_t packed = 0;
    int64_t activations = 0;
    int64_t scratch = 0;
    int64_t runtime = kRuntimeBaseBytes;
    int micro_batches_in_flight = 1;

    int64_t total() const {
        return parameters + gradients + optimizer + packed + activations + scratch + runtime;
    }
};

// Micro-batches whose activations a rank holds at once under the finalized configuration's
// schedule (the header's in_flight).
int micro_batches_in_flight(const Config& cfg);

// The header's per-micro-batch activation terms: fwd + bwd of a MoE and of a dense layer, the
// output state, and the two f32 (T, H) gradient hand-offs (8TH).
struct ActivationBytes {
    int64_t moe_layer = 0;
    int64_t dense_layer = 0;
    int64_t output = 0;
    int64_t handoff = 0;
    int64_t layer_input = 0;  // 4TH: the layer input x, all a fully recomputed group keeps
};
ActivationBytes activation_bytes(const Config& cfg);
// One micro-batch's activations through layers [first, end) (`moe_layers` and `recompute_first`
// as model::GptShape's, the latter empty without full recompute): the sum of the layers' fwd +
// bwd. Full recompute: a recomputed group keeps only its input (4TH) from its forward to its
// backward, and holds its layers' activations again while it is recomputed and runs its backward,
// when the layers above it are done. The peak over the backward:
//   max(kept + 4TH groups,  max over groups g (kept below g + 4TH groups below g + g's layers))
int64_t layers_activation_bytes(const ActivationBytes& a, const std::vector<bool>& moe_layers,
                                const std::vector<int>& recompute_first, int64_t first,
                                int64_t end);
// The compute stream's scratch (header).
int64_t scratch_bytes(const Config& cfg);

// One rank of a job of `world_size` ranks running the finalized configuration `cfg` (its EP
// rank holds num_moe_experts / EP experts), every layer on the rank (PP = 1). With pipeline
// stages the step plan's estimate (train/memory_plan.h) counts each stage's own layers and the
// micro-batches its call list holds.
MemoryEstimate estimate_rank_memory(const Config& cfg, int64_t world_size);

// "1.23 GiB per rank: parameters 0.10, gradients 0.05, ... GiB".
std::string format_memory_estimate(const MemoryEstimate& m);

// Memory this process may still use: MemAvailable of /proc/meminfo, or the cgroup's limit minus
// its usage when that is lower; nullopt when neither can be read.
std::optional<int64_t> available_memory_bytes();

// Raises kConfig when `ranks_on_host` ranks of `estimate` need more than `available` bytes,
// naming both numbers and the fields that shrink it. A nullopt `available` passes.
void check_memory_fits(const MemoryEstimate& estimate, int ranks_on_host,
                       std::optional<int64_t> available);

}  // namespace epo::config
