#include "epo/train/run_plan.h"

#include <fmt/format.h>

#include "epo/core/error.h"
#include "epo/train/flops.h"
#include "epo/train/memory_plan.h"

namespace epo::train {

RunPlan resolve_run(const config::Config& cfg, int world_size, int world_rank) {
    if (config::world_size(cfg) != world_size) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("the configuration's topology has {} ranks (comm.num_nodes x "
                                "comm.gpus_per_node), the job {}; state the job's topology",
                                config::world_size(cfg), world_size));
    }
    RunPlan r;
    r.cfg = cfg;
    r.world_size = world_size;
    r.world_rank = world_rank;
    const int num_stages = cfg.model.pipeline_model_parallel_size;
    const int ep_size = cfg.model.expert_model_parallel_size;
    r.stage_size = world_size / num_stages;
    r.stage = world_rank / r.stage_size;
    r.rank_in_stage = world_rank % r.stage_size;
    r.num_micro_batches = config::num_microbatches(cfg);
    // The expert groups' order etp-ep-edp-pp puts ETP innermost in a stage, then EP; the dense
    // order tp-cp-dp-pp TP innermost (comm/topology.h): a rank's ETP and TP places are its place
    // in the stage modulo each, its EP place the next digit above ETP.
    const int tp_size = cfg.model.tensor_model_parallel_size;
    const int etp_size = config::expert_tensor_parallel_size(cfg.model);
    r.shape =
        model::gpt_shape_from_config(cfg, ep_size, (r.rank_in_stage / etp_size) % ep_size, r.stage);
    r.shape.etp_size = etp_size;
    r.shape.etp_rank = r.rank_in_stage % etp_size;
    r.shape.tp_size = tp_size;
    r.shape.tp_rank = r.rank_in_stage % tp_size;
    r.shape.sequence_parallel = tp_size > 1 && cfg.model.sequence_parallel;
    r.step = make_step_plan(cfg, r.shape);
    r.groups =
        comm::ParallelLayout{.world_size = world_size,
                             .expert_model_parallel_size = ep_size,
                             .gpus_per_node = config::gpus_per_node(cfg.comm),
                             .pipeline_model_parallel_size = num_stages,
                             .tensor_model_parallel_size = cfg.model.tensor_model_parallel_size,
                             .expert_tensor_parallel_size = etp_size};
    r.comm.timeout_s = cfg.comm.timeout_s;
    r.comm.link = comm::LinkModel{cfg.comm.link.inter_node_gbps.value_or(0.0),
                                  cfg.comm.link.intra_node_gbps.value_or(0.0),
                                  cfg.comm.link.latency_us.value_or(0.0)};
    r.optimizer = optimizer_config_from(cfg);
    r.data = DatasetConfig{.type = cfg.dataset.type == config::DatasetType::kText ? "text" : "mock",
                           .path = cfg.dataset.path.value_or(""),
                           .seq_length = cfg.model.seq_length,
                           .vocab_size = cfg.model.vocab_size.value_or(0),
                           .seed = static_cast<uint64_t>(cfg.train.seed)};
    r.memory = estimate_stage_memory(cfg, r.step, r.shape);
    r.step_flops = model_flops(r.shape, config::global_batch_size(cfg));
    return r;
}

}  // namespace epo::train
