#include "epo/moe/router.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "epo/comm/communicator.h"
#include "epo/kernels/gemm.h"
#include "epo/kernels/rows.h"
#include "epo/moe/weight_grad.h"

namespace epo::moe {
namespace {

using kernels::as_matrix;

constexpr float kSigmoidNormEps = 1e-20f;  // as the reference: p / (sum p + 1e-20)

// s = softmax(l) over n values in f32: max, exp(l - max), sequential sum, divide.
void softmax_row(const float* l, std::int64_t n, float* s) {
    float m = l[0];
    for (std::int64_t e = 1; e < n; ++e) {
        m = std::max(m, l[e]);
    }
    float sum = 0.0f;
    for (std::int64_t e = 0; e < n; ++e) {
        s[e] = std::exp(l[e] - m);
        sum += s[e];
    }
    for (std::int64_t e = 0; e < n; ++e) {
        s[e] /= sum;
    }
}

float logsumexp_row(const float* l, std::int64_t n) {
    float m = l[0];
    for (std::int64_t e = 1; e < n; ++e) {
        m = std::max(m, l[e]);
    }
    float sum = 0.0f;
    for (std::int64_t e = 0; e < n; ++e) {
        sum += std::exp(l[e] - m);
    }
    return m + std::log(sum);
}

float sigmoid(float x) {
    return 1.0f / (1.0f + std::exp(-x));
}

// Group-limited top-k: keep the group_topk groups with the largest sum of their best
// topk / group_topk values, then the top-k experts inside them.
void group_topk_indices(const MoeConfig& cfg, const float* sel, float* masked, float* group_score,
                        std::int32_t* group_idx, std::int32_t* best, std::int32_t* out) {
    const std::int64_t e_count = cfg.num_experts, g_count = cfg.num_groups;
    const std::int64_t g_size = e_count / g_count, per_group = cfg.topk / cfg.group_topk;
    for (std::int64_t g = 0; g < g_count; ++g) {
        topk_indices(sel + g * g_size, g_size, per_group, best);
        float s = 0.0f;
        for (std::int64_t j = 0; j < per_group; ++j) {
            s += sel[g * g_size + best[j]];
        }
        group_score[g] = s;
    }
    topk_indices(group_score, g_count, cfg.group_topk, group_idx);
    std::fill(masked, masked + e_count, -INFINITY);
    for (std::int64_t j = 0; j < cfg.group_topk; ++j) {
        const std::int64_t g = group_idx[j];
        std::copy(sel + g * g_size, sel + (g + 1) * g_size, masked + g * g_size);
    }
    topk_indices(masked, e_count, cfg.topk, out);
}

// s_aux for one token: softmax scores as they are, sigmoid scores normalized per token.
void aux_scores_row(const MoeConfig& cfg, const float* scores, float* s_aux) {
    const std::int64_t e_count = cfg.num_experts;
    if (cfg.score_function == ScoreFunction::kSoftmax) {
        std::copy(scores, scores + e_count, s_aux);
        return;
    }
    float sum = 0.0f;
    for (std::int64_t e = 0; e < e_count; ++e) {
        sum += scores[e];
    }
    for (std::int64_t e = 0; e < e_count; ++e) {
        s_aux[e] = scores[e] / (sum + kSigmoidNormEps);
    }
}

// counts[i] = the sum over the group's ranks, in group-rank order, of their counts[i]. Integers,
// so the sum is exact and the same on every rank; an all-gather (the communicator's deadline
// bounds it) rather than the fp32 all-reduce, which is exact only below 2^24.
void sum_counts_over_group(comm::Communicator& group, std::vector<std::int64_t>& counts) {
    const std::size_t n = counts.size();
    std::vector<std::int64_t> all(n * static_cast<std::size_t>(group.size()));  // [rank, i]
    group.all_gather(std::span<const std::int64_t>(counts), std::span<std::int64_t>(all));
    std::fill(counts.begin(), counts.end(), 0);
    for (std::size_t i = 0; i < all.size(); ++i) {
        counts[i % n] += all[i];
    }
}

// The weight operand of the router's products.
const Tensor& weight_operand(const MoeConfig& cfg, const RouterParams& params) {
    EPO_CHECK(params.weight.compute_dtype() == router_dtype(cfg),
              "router weight is {}, the router computes in {}",
              dtype_name(params.weight.compute_dtype()), dtype_name(router_dtype(cfg)));
    return params.weight.compute;
}

}  // namespace

void topk_indices(const float* v, std::int64_t n, std::int64_t k, std::int32_t* out) {
    // Insertion into a sorted list of the best k so far; an equal value never passes an earlier
    // (lower-index) one.
    std::int64_t filled = 0;
    for (std::int64_t e = 0; e < n; ++e) {
        if (filled == k && !(v[e] > v[out[k - 1]])) {
            continue;
        }
        std::int64_t pos = std::min(filled, k - 1);
        while (pos > 0 && v[e] > v[out[pos - 1]]) {
            out[pos] = out[pos - 1];
            --pos;
        }
        out[pos] = static_cast<std::int32_t>(e);
        filled = std::min(filled + 1, k);
    }
}

RouterParams make_router_params(const MoeConfig& cfg) {
    RouterParams p;
    // An fp32 router (moe_router_dtype fp32) computes with the master itself.
    p.weight = make_param("router.weight", {cfg.num_experts, cfg.hidden_size}, router_dtype(cfg));
    if (cfg.enable_expert_bias) {
        p.expert_bias = Tensor::zeros({cfg.num_experts}, DType::kF32);
    }
    return p;
}

RouterOutput router_forward(const MoeConfig& cfg, const RouterParams& params, const Tensor& x,
                            std::int64_t num_sequences, Arena& arena,
                            comm::Communicator* sequence_group) {
    const std::int64_t t_count = x.dim(0), e_count = cfg.num_experts, k = cfg.topk;
    check_tensor(x, {t_count, cfg.hidden_size}, compute_dtype(cfg), "router input x");
    const int group_size = sequence_group ? sequence_group->size() : 1;
    const std::int64_t total_tokens = t_count * group_size;  // N
    // aux_loss pools the micro-batch's tokens, as the reference counts it; only seq_aux_loss
    // keeps its sequences apart.
    if (cfg.load_balancing_type != LoadBalancing::kSeqAuxLoss)
        num_sequences = 1;
    if (num_sequences < 1 || total_tokens % num_sequences != 0) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("router: {} tokens ({} on each of {} ranks) do not split into {} "
                                "sequences of equal length",
                                total_tokens, t_count, group_size, num_sequences));
    }
    RouterOutput out;
    out.num_sequences = num_sequences;
    out.total_tokens = total_tokens;
    out.row_begin = sequence_group ? t_count * sequence_group->rank() : 0;
    out.x = x;
    if (router_dtype(cfg) != x.dtype()) {  // fp32 router in bf16 mode
        out.x = arena.alloc(x.shape(), DType::kF32);
        convert_bf16_to_f32(x.data<BF16>(), out.x.data<float>(),
                            static_cast<std::size_t>(x.numel()));
    }
    out.logits = arena.alloc({t_count, e_count}, DType::kF32);
    out.scores = arena.alloc({t_count, e_count}, DType::kF32);
    out.topk_index = arena.alloc({t_count, k}, DType::kI32);
    out.topk_prob = arena.alloc({t_count, k}, DType::kF32);
    out.topk_weight = arena.alloc({t_count, k}, DType::kF32);
    out.routed_counts.assign(static_cast<std::size_t>(e_count), 0);
    const bool aux = has_aux_loss(cfg), z = cfg.z_loss_coeff > 0;
    if (aux) {
        out.aux_counts.assign(static_cast<std::size_t>(out.num_sequences * e_count), 0);
    }
    if (z) {
        out.lse = arena.alloc({t_count}, DType::kF32);
    }

    kernels::gemm(as_matrix(out.x), as_matrix(weight_operand(cfg, params)), as_matrix(out.logits),
                  {false, /*trans_b=*/true, false, false});

    // Per-token scratch (E or K values), from the arena like everything else.
    float* sel = arena.alloc({e_count}, DType::kF32).data<float>();
    float* masked = arena.alloc({e_count}, DType::kF32).data<float>();
    float* s_aux = arena.alloc({e_count}, DType::kF32).data<float>();
    float* group_score =
        arena.alloc({std::max<std::int64_t>(cfg.num_groups, 1)}, DType::kF32).data<float>();
    std::int32_t* group_idx =
        arena.alloc({std::max<std::int64_t>(cfg.num_groups, 1)}, DType::kI32).data<std::int32_t>();
    std::int32_t* best = arena.alloc({k}, DType::kI32).data<std::int32_t>();
    std::int32_t* aux_idx = arena.alloc({k}, DType::kI32).data<std::int32_t>();
    std::vector<double> aux_prob_sum(aux ? static_cast<std::size_t>(out.num_sequences * e_count)
                                         : 0);
    double z_sum = 0.0;
    const float* bias = cfg.enable_expert_bias ? params.expert_bias.data<float>() : nullptr;
    const std::int64_t seq_len = total_tokens / out.num_sequences;

    for (std::int64_t t = 0; t < t_count; ++t) {
        const float* l = out.logits.data<float>() + t * e_count;
        float* s = out.scores.data<float>() + t * e_count;
        for (std::int64_t e = 0; e < e_count; ++e) {
            if (!std::isfinite(l[e])) {
                throw Error(ErrorKind::kNumerics,
                            fmt::format("router logit of token {} for expert {} is {}: the input "
                                        "or the router weight holds NaN/Inf",
                                        t, e, l[e]));
            }
        }
        if (z) {
            const float lse = logsumexp_row(l, e_count);
            out.lse.data<float>()[t] = lse;
            z_sum += static_cast<double>(lse) * lse;
        }
        if (cfg.score_function == ScoreFunction::kSoftmax) {
            softmax_row(l, e_count, s);
            std::copy(cfg.pre_softmax ? s : l, (cfg.pre_softmax ? s : l) + e_count, sel);
        } else {
            for (std::int64_t e = 0; e < e_count; ++e) {
                s[e] = sigmoid(l[e]);
                sel[e] = bias ? s[e] + bias[e] : s[e];
            }
        }
        std::int32_t* idx = out.topk_index.data<std::int32_t>() + t * k;
        if (cfg.num_groups > 0) {
            group_topk_indices(cfg, sel, masked, group_score, group_idx, best, idx);
        } else {
            topk_indices(sel, e_count, k, idx);
        }
        float* prob = out.topk_prob.data<float>() + t * k;
        if (cfg.score_function == ScoreFunction::kSoftmax && !cfg.pre_softmax) {
            for (std::int64_t j = 0; j < k; ++j) {
                masked[j] = l[idx[j]];
            }
            softmax_row(masked, k, prob);
        } else {
            for (std::int64_t j = 0; j < k; ++j) {
                prob[j] = s[idx[j]];
            }
            if (cfg.score_function == ScoreFunction::kSigmoid && k > 1) {
                float sum = 0.0f;
                for (std::int64_t j = 0; j < k; ++j) {
                    sum += prob[j];
                }
                for (std::int64_t j = 0; j < k; ++j) {
                    prob[j] /= sum + kSigmoidNormEps;
                }
            }
        }
        float* weight = out.topk_weight.data<float>() + t * k;
        const float scale =
            cfg.topk_scaling_factor ? static_cast<float>(*cfg.topk_scaling_factor) : 1.0f;
        for (std::int64_t j = 0; j < k; ++j) {
            weight[j] = cfg.topk_scaling_factor ? prob[j] * scale : prob[j];
            ++out.routed_counts[static_cast<std::size_t>(idx[j])];
        }
        if (aux) {
            const std::int64_t b = (out.row_begin + t) / seq_len;
            aux_scores_row(cfg, s, s_aux);
            topk_indices(s_aux, e_count, k, aux_idx);
            for (std::int64_t j = 0; j < k; ++j) {
                ++out.aux_counts[static_cast<std::size_t>(b * e_count + aux_idx[j])];
            }
            for (std::int64_t e = 0; e < e_count; ++e) {
                aux_prob_sum[static_cast<std::size_t>(b * e_count + e)] += s_aux[e];
            }
        }
    }
    if (aux && group_size > 1) {
        // The whole micro-batch's counts: every rank's, summed in group-rank order.
        sum_counts_over_group(*sequence_group, out.aux_counts);
    }
    if (aux) {
        // Each sequence's loss E / (K L^2) sum_e P_b[e] c_b[e], averaged over sequences.
        double total = 0.0;
        for (std::size_t i = 0; i < aux_prob_sum.size(); ++i) {
            total += aux_prob_sum[i] * static_cast<double>(out.aux_counts[i]);
        }
        const double l2 = static_cast<double>(seq_len) * static_cast<double>(seq_len);
        out.aux_loss = static_cast<float>(cfg.aux_loss_coeff * static_cast<double>(e_count) /
                                          (static_cast<double>(k) * l2) * total /
                                          static_cast<double>(out.num_sequences));
    }
    if (z) {
        out.z_loss =
            static_cast<float>(cfg.z_loss_coeff * z_sum / static_cast<double>(total_tokens));
    }
    return out;
}

void router_backward_dlogits(const MoeConfig& cfg, const RouterParams& params,
                             const Tensor& dweight, float loss_grad_scale, RouterOutput& out,
                             Arena& arena) {
    const std::int64_t t_count = out.logits.dim(0), e_count = cfg.num_experts, k = cfg.topk;
    check_tensor(dweight, {t_count, k}, DType::kF32, "router dweight");
    out.dlogits = arena.alloc({t_count, e_count}, DType::kF32);
    const bool aux = has_aux_loss(cfg), z = cfg.z_loss_coeff > 0;
    const std::int64_t seq_len = out.total_tokens / out.num_sequences;
    // d aux / d s_aux[t, e] = aux_scale * c_b[e]
    const float aux_scale =
        aux ? static_cast<float>(static_cast<double>(loss_grad_scale) * cfg.aux_loss_coeff *
                                 static_cast<double>(e_count) /
                                 (static_cast<double>(k) * static_cast<double>(seq_len) *
                                  static_cast<double>(seq_len) *
                                  static_cast<double>(out.num_sequences)))
            : 0.0f;
    const float z_scale =
        z ? static_cast<float>(static_cast<double>(loss_grad_scale) * cfg.z_loss_coeff * 2.0 /
                               static_cast<double>(out.total_tokens))
          : 0.0f;
    const float scale =
        cfg.topk_scaling_factor ? static_cast<float>(*cfg.topk_scaling_factor) : 1.0f;
    float* dw = arena.alloc({k}, DType::kF32).data<float>();
    float* ga = arena.alloc({e_count}, DType::kF32).data<float>();
    float* s_aux = arena.alloc({e_count}, DType::kF32).data<float>();

    for (std::int64_t t = 0; t < t_count; ++t) {
        const float* l = out.logits.data<float>() + t * e_count;
        const float* s = out.scores.data<float>() + t * e_count;
        const std::int32_t* idx = out.topk_index.data<std::int32_t>() + t * k;
        const float* prob = out.topk_prob.data<float>() + t * k;
        float* dl = out.dlogits.data<float>() + t * e_count;
        std::fill(dl, dl + e_count, 0.0f);
        for (std::int64_t j = 0; j < k; ++j) {
            const float d = dweight.data<float>()[t * k + j];
            dw[j] = cfg.topk_scaling_factor ? d * scale : d;
        }
        // Routing weights -> logits.
        if (cfg.score_function == ScoreFunction::kSoftmax && !cfg.pre_softmax) {
            float dot = 0.0f;
            for (std::int64_t j = 0; j < k; ++j) {
                dot += prob[j] * dw[j];
            }
            for (std::int64_t j = 0; j < k; ++j) {
                dl[idx[j]] += prob[j] * (dw[j] - dot);
            }
        } else if (cfg.score_function == ScoreFunction::kSoftmax) {
            float dot = 0.0f;
            for (std::int64_t j = 0; j < k; ++j) {
                dot += s[idx[j]] * dw[j];
            }
            for (std::int64_t e = 0; e < e_count; ++e) {
                dl[e] = -s[e] * dot;
            }
            for (std::int64_t j = 0; j < k; ++j) {
                dl[idx[j]] = s[idx[j]] * (dw[j] - dot);
            }
        } else {
            if (k > 1) {
                float sum = 0.0f, dot = 0.0f;
                for (std::int64_t j = 0; j < k; ++j) {
                    sum += s[idx[j]];
                }
                for (std::int64_t j = 0; j < k; ++j) {
                    dot += prob[j] * dw[j];
                }
                for (std::int64_t j = 0; j < k; ++j) {
                    dw[j] = (dw[j] - dot) / (sum + kSigmoidNormEps);
                }
            }
            for (std::int64_t j = 0; j < k; ++j) {
                const float v = s[idx[j]];
                dl[idx[j]] += dw[j] * (v * (1.0f - v));
            }
        }
        // Load-balancing loss -> logits (through s_aux only).
        if (aux) {
            const std::int64_t b = (out.row_begin + t) / seq_len;
            for (std::int64_t e = 0; e < e_count; ++e) {
                ga[e] = aux_scale * static_cast<float>(
                                        out.aux_counts[static_cast<std::size_t>(b * e_count + e)]);
            }
            aux_scores_row(cfg, s, s_aux);
            float dot = 0.0f;
            for (std::int64_t e = 0; e < e_count; ++e) {
                dot += s_aux[e] * ga[e];
            }
            if (cfg.score_function == ScoreFunction::kSoftmax) {
                for (std::int64_t e = 0; e < e_count; ++e) {
                    dl[e] += s_aux[e] * (ga[e] - dot);
                }
            } else {
                float sum = 0.0f;
                for (std::int64_t e = 0; e < e_count; ++e) {
                    sum += s[e];
                }
                for (std::int64_t e = 0; e < e_count; ++e) {
                    dl[e] += (ga[e] - dot) / (sum + kSigmoidNormEps) * (s[e] * (1.0f - s[e]));
                }
            }
        }
        // z-loss -> logits: 2 z_coeff / T * lse_t * softmax(logits)[e].
        if (z) {
            const float g = z_scale * out.lse.data<float>()[t];
            for (std::int64_t e = 0; e < e_count; ++e) {
                dl[e] += g * std::exp(l[e] - out.lse.data<float>()[t]);
            }
        }
    }
    // The operand of dx += dlogits W_r and of the weight gradient, in the router dtype.
    if (router_dtype(cfg) == DType::kF32) {
        out.dlogits_c = out.dlogits;
    } else {
        out.dlogits_c = arena.alloc({t_count, e_count}, DType::kBF16);
        convert_f32_to_bf16(out.dlogits.data<float>(), out.dlogits_c.data<BF16>(),
                            static_cast<std::size_t>(t_count * e_count));
    }
}

void router_dx_add_row(const MoeConfig& cfg, const RouterParams& params, const RouterOutput& out,
                       std::int64_t t, float* acc) {
    const std::int64_t e_count = cfg.num_experts;
    EPO_CHECK(out.dlogits_c.defined(), "router dx before its dlogits");
    thread_local std::vector<float> coeff;  // grows to the expert count once
    coeff.resize(static_cast<std::size_t>(e_count));
    kernels::load_row(static_cast<const char*>(out.dlogits_c.raw()) +
                          static_cast<std::size_t>(t * e_count) * dtype_size(out.dlogits_c.dtype()),
                      out.dlogits_c.dtype(), coeff.data(), e_count);
    const Tensor& w = weight_operand(cfg, params);
    kernels::add_combination_row(coeff.data(), e_count, w.raw(), w.dtype(), cfg.hidden_size, acc,
                                 cfg.hidden_size);
}

void router_backward_dgrad(const MoeConfig& cfg, const RouterParams& params, const Tensor& dweight,
                           float loss_grad_scale, RouterOutput& out, const Tensor& dx_acc,
                           Arena& arena) {
    const std::int64_t t_count = out.logits.dim(0);
    check_tensor(dx_acc, {t_count, cfg.hidden_size}, DType::kF32, "router dx accumulator");
    router_backward_dlogits(cfg, params, dweight, loss_grad_scale, out, arena);
    for (std::int64_t t = 0; t < t_count; ++t) {
        router_dx_add_row(cfg, params, out, t, dx_acc.data<float>() + t * cfg.hidden_size);
    }
}

void router_backward_wgrad(const MoeConfig& cfg, RouterParams& params, const RouterOutput& out,
                           Arena& arena) {
    EPO_CHECK(out.dlogits_c.defined(), "router wgrad before its dgrad");
    Tensor workspace;
    if (!cfg.gradient_accumulation_fusion) {
        workspace = arena.alloc(params.weight.shape(), DType::kF32);
    }
    // d W_r [E, H] += dlogits^T [E, T] x [T, H]
    accumulate_weight_grad(as_matrix(out.dlogits_c), as_matrix(out.x),
                           as_matrix(params.weight.main_grad), /*trans_a=*/true, false,
                           cfg.gradient_accumulation_fusion, workspace);
}

void update_expert_bias(const Tensor& expert_bias, std::span<const std::int64_t> tokens_per_expert,
                        double rate) {
    const std::int64_t e_count = expert_bias.numel();
    EPO_CHECK_EQ(static_cast<std::int64_t>(tokens_per_expert.size()), e_count);
    double mean = 0.0;
    for (std::int64_t c : tokens_per_expert) {
        mean += static_cast<double>(c);
    }
    mean /= static_cast<double>(e_count);
    float* b = expert_bias.data<float>();
    for (std::int64_t e = 0; e < e_count; ++e) {
        const double offset =
            mean - static_cast<double>(tokens_per_expert[static_cast<std::size_t>(e)]);
        const double sign = offset > 0 ? 1.0 : (offset < 0 ? -1.0 : 0.0);
        b[e] = static_cast<float>(b[e] + sign * rate);
    }
}

}  // namespace epo::moe
