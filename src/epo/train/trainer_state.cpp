// A Trainer's state as checkpoint tensors, and back (checkpoint/checkpoint.h holds the format
// and the crash-safe protocol).
//
// Per rank, all fp32:
//   <param name>               the master weight (the bf16 compute copy is derived from it)
//   <param name>.exp_avg       Adam's first moment m
//   <param name>.exp_avg_sq    Adam's second moment v
//   decoder.layers.<l>.mlp.router.expert_bias   when the router has one (updated from token
//                                                counts, not by the optimizer)
// With pipeline parallelism a rank's file holds its stage's tensors (its layout is part of the
// checkpoint's, so a resume under another pipeline layout is refused naming both).
// Scalars in the metadata: iteration (= Adam's step count and the LR schedule's position),
// consumed samples (the data position: sample indices are a pure function of the step).
// Gradients are not saved: they are zero between steps.
#include <algorithm>
#include <cstring>
#include <set>

#include "epo/checkpoint/checkpoint.h"
#include "epo/checkpoint/rank_agreement.h"
#include "epo/config/yaml_io.h"
#include "epo/train/trainer.h"

namespace epo::train {
namespace {

// Live views of every tensor a checkpoint holds, in file order (copying into them restores it).
std::vector<io::NamedTensor> state_views(model::GptModel& model, const std::vector<Param*>& params,
                                         std::vector<std::vector<float>>& exp_avg,
                                         std::vector<std::vector<float>>& exp_avg_sq) {
    std::vector<io::NamedTensor> views;
    for (size_t i = 0; i < params.size(); ++i) {
        const Param& p = *params[i];
        views.push_back({p.name, p.master});
        views.push_back(
            {p.name + ".exp_avg", Tensor::wrap(exp_avg[i].data(), p.shape(), DType::kF32)});
        views.push_back(
            {p.name + ".exp_avg_sq", Tensor::wrap(exp_avg_sq[i].data(), p.shape(), DType::kF32)});
    }
    const model::GptShape& s = model.shape();
    for (int64_t l = 0; l < s.num_layers; ++l) {
        if (!s.holds(l))
            continue;  // another pipeline stage's layer
        const Tensor& bias = model.layer(static_cast<int>(l)).moe.router.expert_bias;
        if (s.moe_layers[static_cast<size_t>(l)] && bias.defined())
            views.push_back({fmt::format("decoder.layers.{}.mlp.router.expert_bias", l), bias});
    }
    return views;
}

// Every expected tensor present with its shape and dtype, and nothing else; kConfig otherwise.
void check_tensors_match(const std::vector<io::NamedTensor>& expected,
                         const io::SafetensorsFile& file) {
    std::vector<std::string> problems;
    std::set<std::string> names;
    for (const io::NamedTensor& e : expected) {
        names.insert(e.name);
        const Tensor* t = file.find(e.name);
        if (t == nullptr) {
            problems.push_back(fmt::format("'{}' is missing", e.name));
        } else if (t->dtype() != e.tensor.dtype() || t->shape() != e.tensor.shape()) {
            problems.push_back(
                fmt::format("'{}' is {} {} in the checkpoint, {} {} in this model", e.name,
                            io::safetensors_dtype_name(t->dtype()), t->shape().str(),
                            io::safetensors_dtype_name(e.tensor.dtype()), e.tensor.shape().str()));
        }
    }
    for (const io::NamedTensor& t : file.tensors) {
        if (!names.count(t.name))
            problems.push_back(fmt::format("'{}' is not part of this model", t.name));
    }
    if (problems.empty())
        return;
    std::string list;
    for (size_t i = 0; i < problems.size() && i < 8; ++i)
        list += "\n  " + problems[i];
    if (problems.size() > 8)
        list += fmt::format("\n  ... and {} more", problems.size() - 8);
    throw Error(
        ErrorKind::kConfig,
        fmt::format("checkpoint file '{}' does not hold this model's state:{}", file.source, list));
}

}  // namespace

std::filesystem::path Trainer::save_checkpoint(const std::filesystem::path& save_dir,
                                               comm::Communicator& world) {
    const checkpoint::CheckpointInfo info{
        .iteration = steps_done_,
        .consumed_samples = steps_done_ * config::global_batch_size(cfg_),
        .seed = static_cast<uint64_t>(cfg_.train.seed),
        .layout = checkpoint::world_layout_of(cfg_, world_size_),
        .config_yaml = config::to_yaml(cfg_)};
    // Whole tensors in the files either way: the distributed optimizer's shards are gathered.
    sync_params();
    std::vector<std::vector<float>> exp_avg, exp_avg_sq;
    if (optimizer_.distributed) {
        streams_.comm->enqueue("gather_moments", [&](runtime::StreamContext& ctx) {
            exp_avg = full_moments(optimizer_, false, ctx.comm());
            exp_avg_sq = full_moments(optimizer_, true, ctx.comm());
        });
        streams_.synchronize();
    }
    return checkpoint::save_checkpoint(
        save_dir, info,
        state_views(*model_, optimizer_.params,
                    optimizer_.distributed ? exp_avg : optimizer_.exp_avg,
                    optimizer_.distributed ? exp_avg_sq : optimizer_.exp_avg_sq),
        world);
}

void Trainer::load_checkpoint(const std::filesystem::path& checkpoint_dir,
                              comm::Communicator& world) {
    // The files hold whole moments; the distributed optimizer keeps its shard of them.
    std::vector<std::vector<float>> exp_avg, exp_avg_sq;
    if (optimizer_.distributed) {
        for (const Param* p : optimizer_.params) {
            exp_avg.emplace_back(static_cast<size_t>(p->master.numel()), 0.0f);
            exp_avg_sq.emplace_back(static_cast<size_t>(p->master.numel()), 0.0f);
        }
    }
    const std::vector<io::NamedTensor> views = state_views(
        *model_, optimizer_.params, optimizer_.distributed ? exp_avg : optimizer_.exp_avg,
        optimizer_.distributed ? exp_avg_sq : optimizer_.exp_avg_sq);
    checkpoint::RankCheckpoint loaded;
    std::exception_ptr failure;
    try {
        loaded = checkpoint::read_rank_checkpoint(checkpoint_dir, world_rank_,
                                                  checkpoint::world_layout_of(cfg_, world_size_));
        checkpoint::check_resume_config(loaded.info.config_yaml, cfg_, checkpoint_dir);
        check_tensors_match(views, loaded.file);
    } catch (...) {
        failure = std::current_exception();
    }
    // Nothing has changed yet; from here on every rank applies its verified file.
    checkpoint::agree_on_success(world, failure);
    for (const io::NamedTensor& v : views)
        v.tensor.copy_from(loaded.file.at(v.name));
    for (size_t i = 0; optimizer_.distributed && i < optimizer_.params.size(); ++i) {
        const comm::ShardRange shard = optimizer_.shard[i];
        std::copy(exp_avg[i].begin() + shard.begin, exp_avg[i].begin() + shard.end,
                  optimizer_.exp_avg[i].begin());
        std::copy(exp_avg_sq[i].begin() + shard.begin, exp_avg_sq[i].begin() + shard.end,
                  optimizer_.exp_avg_sq[i].begin());
    }
    for (Param* p : optimizer_.params) {
        refresh_compute(*p);
        zero_grad(*p);
    }
    optimizer_.params_pending = false;  // every rank has loaded every weight in full
    steps_done_ = loaded.info.iteration;
}

}  // namespace epo::train
