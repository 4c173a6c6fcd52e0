#include "epo/bench/proxies.h"

namespace epo::bench {

const char* const kProxyRecipe = "qwen3-30b-a3b";

namespace {

// What both proxies run as their recipes do: the distributed optimizer with bucketed
// grad-reduce and param-gather overlap (set in comm_overlap, which finalization copies into
// ddp), 8 MiB buckets, TP comm overlap stated off (a comm_overlap section must state it), and 2
// ranks as 2 nodes of 1, so all expert traffic crosses the modelled NIC.
constexpr const char* kProxyRunSections = R"(ddp:
  use_distributed_optimizer: true
comm_overlap:
  tp_comm_overlap: false
  overlap_grad_reduce: true
  overlap_param_gather: true
  bucket_size: 8388608
comm:
  num_nodes: 2
  gpus_per_node: 1
)";

}  // namespace

const std::string& proxy_yaml() {
    // Real widths of qwen3-30b-a3b (expert FFN 768, head dim 128); hidden 1024 with the heads
    // scaled from 32 query / 4 key-value heads at hidden 2048; 16 experts with top-4 routing
    // (qwen3: 128, top-8), so two CPU ranks finish a step in seconds; 2 layers, sequence 512,
    // vocabulary 2048 (a small vocabulary keeps the dense gradient all-reduce, which can hide
    // only behind the last backward, below the all-to-all traffic); 2 ranks as 2 nodes of 1
    // (all expert traffic crosses the modelled NIC); 8 micro-batches per step. As in the
    // recipe, the distributed optimizer with bucketed grad-reduce and param-gather overlap
    // (set in comm_overlap, which finalization copies into ddp), with 8 MiB buckets: each of the 2
    // layers, the output layer and the embedding is a bucket of its own, as a 48-layer model's 128
    // MiB buckets hold a few of its layers each.
    static const std::string yaml = R"(model:
  num_layers: 2
  hidden_size: 1024
  num_attention_heads: 16
  num_query_groups: 2
  kv_channels: 128
  ffn_hidden_size: 3072
  moe_ffn_hidden_size: 768
  num_moe_experts: 16
  moe_router_topk: 4
  seq_length: 512
  vocab_size: 2048
  expert_model_parallel_size: 2
train:
  micro_batch_size: 1
  global_batch_size: 16
  train_iters: 3
  lr_warmup_iters: 1
)" + std::string(kProxyRunSections);
    return yaml;
}

const std::string& deepseek_v3_proxy_yaml() {
    // Over the deepseek-v3 recipe, which keeps what the runtime runs: MLA with its real widths
    // (q_lora_rank 1536, kv_lora_rank 512, qk_head_dim 128, qk_pos_emb_head_dim 64, v_head_dim
    // 128, the latent norms), sigmoid routing with expert bias, group-limited top-k and the
    // recipe's scaling factor 2.5, the fp32 router, the sequence aux loss, a shared expert of
    // the real FFN 2048 with shared-expert overlap, the real expert FFN 2048, one MTP layer.
    // Shrunk so that two CPU ranks finish a step in seconds (docs/bench.md gives the reasons):
    // - hidden 1024 (7168), 16 heads (128; the same heads per hidden width);
    // - 2 decoder layers, the first dense as the recipe's first 3 of 61 (moe_layer_freq), plus
    //   the MTP layer (MoE, as the last decoder layer): one dense and two MoE layers;
    // - the dense FFN 2688, the recipe's 18432 scaled as the hidden size (x 1024 / 7168, to a
    //   multiple of 128; a first try with 10240 = (top-4 + 1 shared) x 2048 took 16 s a step
    //   here and added 31 M dense parameters to a gradient traffic that already dwarfs the
    //   all-to-alls, docs/bench.md);
    // - 16 experts with top-4 (256, top-8), in 8 groups of which each token keeps 4 (the
    //   recipe's 8 and 4), so group-limited routing still limits a token to half the groups;
    // - sequence 256 (4096), 4 micro-batches per step, vocabulary 2048 (129280: a small
    //   vocabulary keeps the dense gradient reduction below the all-to-all traffic);
    // - 2 ranks as 2 nodes of 1 (all expert traffic crosses the modelled NIC), the distributed
    //   optimizer with bucketed overlap and 8 MiB buckets, as the qwen3-30b-a3b proxy.
    static const std::string yaml = R"(model:
  num_layers: 2
  moe_layer_freq: [0, 1]
  hidden_size: 1024
  num_attention_heads: 16
  num_query_groups: 16
  ffn_hidden_size: 2688
  num_moe_experts: 16
  moe_router_topk: 4
  moe_router_num_groups: 8
  moe_router_group_topk: 4
  seq_length: 256
  vocab_size: 2048
  expert_model_parallel_size: 2
train:
  micro_batch_size: 1
  global_batch_size: 8
  train_iters: 3
  lr_warmup_iters: 1
)" + std::string(kProxyRunSections);
    return yaml;
}

const std::string* bench_proxy_yaml(const std::string& recipe) {
    if (recipe == kProxyRecipe)
        return &proxy_yaml();
    if (recipe == "deepseek-v3")
        return &deepseek_v3_proxy_yaml();
    return nullptr;
}

config::ConfigSources with_default_model(config::ConfigSources sources, bool* is_proxy) {
    const bool proxy = !sources.model && !sources.config_path && !sources.config_text;
    if (proxy) {
        sources.model = kProxyRecipe;
        sources.config_text = proxy_yaml();
    }
    if (is_proxy) {
        *is_proxy = proxy;
    }
    return sources;
}

config::ConfigSources with_bench_model(config::ConfigSources sources, bool* is_proxy) {
    const bool no_file = !sources.config_path && !sources.config_text;
    const std::string* yaml = no_file && sources.model ? bench_proxy_yaml(*sources.model) : nullptr;
    if (!yaml)
        return with_default_model(std::move(sources), is_proxy);
    sources.config_text = *yaml;
    if (is_proxy)
        *is_proxy = true;
    return sources;
}

}  // namespace epo::bench
