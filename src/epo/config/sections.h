// The sections of the configuration tree other than `model`: comm_overlap, ddp, optimizer,
// train, dataset, checkpoint, logger, comm (topology, link model, timeouts) and env (the stack a
// config targets). Names and defaults follow Megatron-Bridge / Megatron-Core where the field
// exists there; the keys our runtime adds (comm.*, train.lr_*, dataset.type/path, logger.*) are
// documented in docs/config.md with their defaults.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "epo/config/field_types.h"

namespace epo::config {

// Communication-overlap settings as the user wrote them. Every field defaults to null = "the user
// did not say"; finalization (finalize.h) computes defaults from the model and lets every non-null
// value here win, then mirrors the result into model/ddp/optimizer. The section itself may be
// absent (Config::comm_overlap is optional): then finalization leaves those sections alone.
struct CommOverlapConfig {
    using IsSection = void;

    // The reference requires this field whenever the section exists; ours defaults it to false
    // at finalization and says so (warning W004).
    std::optional<bool> tp_comm_overlap;
    std::optional<std::string> tp_comm_overlap_cfg;  // name of a TP-overlap (userbuffers) preset
    std::optional<std::string> tp_comm_bootstrap_backend = "nccl";
    std::optional<bool> overlap_p2p_comm;
    std::optional<bool> batch_p2p_comm;
    std::optional<bool> overlap_grad_reduce;
    std::optional<bool> overlap_param_gather;
    std::optional<bool> overlap_param_gather_with_optimizer_step;
    std::optional<bool> align_param_gather;
    std::optional<std::int64_t> bucket_size;  // bytes
    std::optional<bool> defer_embedding_wgrad_compute;
    std::optional<int> wgrad_deferral_limit;
    std::optional<int> data_parallel_size;  // null: world size / (TP * PP * CP)
    std::optional<bool> overlap_moe_expert_parallel_comm;
    std::optional<bool> delay_wgrad_compute;

    bool operator==(const CommOverlapConfig&) const = default;

    template <class Self, class V>
    static void fields(Self& s, V&& v) {
        v("tp_comm_overlap", s.tp_comm_overlap);
        v("tp_comm_overlap_cfg", s.tp_comm_overlap_cfg);
        v("tp_comm_bootstrap_backend", s.tp_comm_bootstrap_backend);
        v("overlap_p2p_comm", s.overlap_p2p_comm);
        v("batch_p2p_comm", s.batch_p2p_comm);
        v("overlap_grad_reduce", s.overlap_grad_reduce);
        v("overlap_param_gather", s.overlap_param_gather);
        v("overlap_param_gather_with_optimizer_step", s.overlap_param_gather_with_optimizer_step);
        v("align_param_gather", s.align_param_gather);
        v("bucket_size", s.bucket_size, Limits::at_least(1));
        v("defer_embedding_wgrad_compute", s.defer_embedding_wgrad_compute);
        v("wgrad_deferral_limit", s.wgrad_deferral_limit, Limits::at_least(-1));
        v("data_parallel_size", s.data_parallel_size, Limits::at_least(1));
        v("overlap_moe_expert_parallel_comm", s.overlap_moe_expert_parallel_comm);
        v("delay_wgrad_compute", s.delay_wgrad_compute);
    }
};

// Megatron-Core DistributedDataParallelConfig (the fields the rules and the runtime read).
struct DdpConfig {
    using IsSection = void;

    bool use_distributed_optimizer = false;
    bool overlap_grad_reduce = false;
    bool overlap_param_gather = false;
    std::optional<std::int64_t> bucket_size;  // bytes; null: one bucket
    bool align_param_gather = false;
    // Gradients accumulated and reduced in fp32 (the main_grad buffers); false: in the compute
    // dtype, as Megatron-Bridge's performance recipes run. Megatron-LM and Bridge's bf16 mixed
    // precision set it true; the epo runtime runs fp32 only (RT047), `epo plan` both.
    bool grad_reduce_in_fp32 = true;
    // Nullable because finalization copies comm_overlap's value into it, null included.
    std::optional<bool> delay_wgrad_compute = false;

    bool operator==(const DdpConfig&) const = default;

    template <class Self, class V>
    static void fields(Self& s, V&& v) {
        v("use_distributed_optimizer", s.use_distributed_optimizer);
        v("overlap_grad_reduce", s.overlap_grad_reduce);
        v("overlap_param_gather", s.overlap_param_gather);
        v("bucket_size", s.bucket_size, Limits::at_least(1));
        v("align_param_gather", s.align_param_gather);
        v("grad_reduce_in_fp32", s.grad_reduce_in_fp32);
        v("delay_wgrad_compute", s.delay_wgrad_compute);
    }
};

// Adam with decoupled weight decay (Megatron-Core OptimizerConfig names and defaults; the
// reference has no default learning rate, ours is 1e-4).
struct OptimizerConfig {
    using IsSection = void;

    double lr = 1e-4;
    double min_lr = 0.0;
    double weight_decay = 0.01;
    double adam_beta1 = 0.9;
    double adam_beta2 = 0.999;
    double adam_eps = 1e-8;
    double clip_grad = 1.0;  // 0: no clipping
    bool overlap_param_gather_with_optimizer_step = false;

    bool operator==(const OptimizerConfig&) const = default;

    template <class Self, class V>
    static void fields(Self& s, V&& v) {
        v("lr", s.lr, Limits::at_least(0));
        v("min_lr", s.min_lr, Limits::at_least(0));
        v("weight_decay", s.weight_decay, Limits::at_least(0));
        v("adam_beta1", s.adam_beta1, Limits::between(0, 1));
        v("adam_beta2", s.adam_beta2, Limits::between(0, 1));
        v("adam_eps", s.adam_eps, Limits::above(0));
        v("clip_grad", s.clip_grad, Limits::at_least(0));
        v("overlap_param_gather_with_optimizer_step", s.overlap_param_gather_with_optimizer_step);
    }
};

struct TrainConfig {
    using IsSection = void;

    int micro_batch_size = 1;
    std::optional<int> global_batch_size;  // null: micro_batch_size * data-parallel size
    int train_iters = 100;
    int seed = 1234;
    int log_interval = 100;
    // Learning-rate schedule: linear warm-up from 0 to optimizer.lr over lr_warmup_iters, then
    // decay to optimizer.min_lr by lr_decay_iters (null: train_iters) in the given style.
    int lr_warmup_iters = 0;
    std::optional<int> lr_decay_iters;
    LrDecayStyle lr_decay_style = LrDecayStyle::kLinear;

    bool operator==(const TrainConfig&) const = default;

    template <class Self, class V>
    static void fields(Self& s, V&& v) {
        v("micro_batch_size", s.micro_batch_size, Limits::at_least(1));
        v("global_batch_size", s.global_batch_size, Limits::at_least(1));
        v("train_iters", s.train_iters, Limits::at_least(1));
        v("seed", s.seed, Limits::at_least(0));
        v("log_interval", s.log_interval, Limits::at_least(1));
        v("lr_warmup_iters", s.lr_warmup_iters, Limits::at_least(0));
        v("lr_decay_iters", s.lr_decay_iters, Limits::at_least(1));
        v("lr_decay_style", s.lr_decay_style);
    }
};

struct DatasetConfig {
    using IsSection = void;

    DatasetType type = DatasetType::kMock;  // mock: synthetic tokens; text: bytes of `path`
    std::optional<std::string> path;

    bool operator==(const DatasetConfig&) const = default;

    template <class Self, class V>
    static void fields(Self& s, V&& v) {
        v("type", s.type);
        v("path", s.path);
    }
};

struct CheckpointConfig {
    using IsSection = void;

    std::optional<std::string> save;   // directory; null: no checkpoints
    std::optional<int> save_interval;  // iterations between saves; null: at the end only
    std::optional<std::string> load;   // directory to resume from

    bool operator==(const CheckpointConfig&) const = default;

    template <class Self, class V>
    static void fields(Self& s, V&& v) {
        v("save", s.save);
        v("save_interval", s.save_interval, Limits::at_least(1));
        v("load", s.load);
    }
};

struct LoggerConfig {
    using IsSection = void;

    std::string log_dir = "runs";  // the run directory is created below it
    bool trace = false;            // write a Chrome trace of both streams per rank

    bool operator==(const LoggerConfig&) const = default;

    template <class Self, class V>
    static void fields(Self& s, V&& v) {
        v("log_dir", s.log_dir);
        v("trace", s.trace);
    }
};

// The modelled network (docs/runtime.md "Link model"). A null or 0 bandwidth leaves that path
// unmodelled; with both unmodelled and no latency the link model is off and runs are plain MPI.
struct LinkConfig {
    using IsSection = void;

    std::optional<double> inter_node_gbps;  // Gbit/s per rank NIC, each direction
    std::optional<double> intra_node_gbps;  // Gbit/s per rank inside a node
    std::optional<double> latency_us;       // added once per collective

    bool operator==(const LinkConfig&) const = default;

    template <class Self, class V>
    static void fields(Self& s, V&& v) {
        v("inter_node_gbps", s.inter_node_gbps, Limits::at_least(0));
        v("intra_node_gbps", s.intra_node_gbps, Limits::at_least(0));
        v("latency_us", s.latency_us, Limits::at_least(0));
    }
};

// Job topology and communication settings. World size = num_nodes * gpus_per_node ranks
// ("gpus" is the reference harness's name; on CPU it means ranks per node). Both may be left
// null, as a Megatron-Bridge config file leaves them: then the launcher decides the topology,
// the checks that need the world size wait for the launch, and a run fills them in from its MPI
// job (resolve_topology in validate.h). A stated gpus_per_node without num_nodes is one node.
struct CommConfig {
    using IsSection = void;

    LinkConfig link;
    std::optional<int> num_nodes;
    std::optional<int> gpus_per_node;
    double timeout_s = 300.0;  // a collective not done by then aborts the job with the rank

    bool operator==(const CommConfig&) const = default;

    template <class Self, class V>
    static void fields(Self& s, V&& v) {
        v("link", s.link);
        v("num_nodes", s.num_nodes, Limits::at_least(1));
        v("gpus_per_node", s.gpus_per_node, Limits::at_least(1));
        v("timeout_s", s.timeout_s, Limits::above(0));
    }
};

// The software/hardware stack a config targets (docs/config.md "Targets"). With neither version set
// the target is our own runtime; `gpu` names the device for flex-dispatcher gating (devices.h).
struct EnvConfig {
    using IsSection = void;

    std::string gpu = "cpu";
    std::optional<std::string> torch_version;
    std::optional<std::string> te_version;

    bool operator==(const EnvConfig&) const = default;

    template <class Self, class V>
    static void fields(Self& s, V&& v) {
        v("gpu", s.gpu);
        v("torch_version", s.torch_version);
        v("te_version", s.te_version);
    }
};

}  // namespace epo::config
