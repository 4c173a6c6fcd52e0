#include "epo/moe/layer_dump.h"

#include <vector>

#include "epo/io/safetensors.h"
#include "epo/tensor/random.h"

namespace epo::moe {
namespace {

Tensor widened(const Tensor& t) {
    if (t.dtype() == DType::kF32) {
        return t.clone();
    }
    Tensor out = Tensor::empty(t.shape(), DType::kF32);
    convert_bf16_to_f32(t.data<BF16>(), out.data<float>(), static_cast<std::size_t>(t.numel()));
    return out;
}

Tensor scalar(float v) {
    Tensor t = Tensor::empty({}, DType::kF32);
    t.data<float>()[0] = v;
    return t;
}

// A random activation in the compute dtype.
Tensor activation(const MoeConfig& cfg, std::int64_t tokens, std::uint64_t seed) {
    Tensor t = Tensor::empty({tokens, cfg.hidden_size}, compute_dtype(cfg));
    fill_normal(t, seed, 0.0f, 1.0f);
    return t;
}

}  // namespace

MoeLayerDumpResult run_moe_layer_dump(const MoeLayerDumpOptions& o) {
    const MoeConfig& cfg = o.cfg;
    validate_moe_config(cfg);
    if (o.tokens < 1) {
        throw Error(ErrorKind::kUsage, fmt::format("--tokens {} must be at least 1", o.tokens));
    }
    if (o.num_sequences < 1 || o.tokens % o.num_sequences != 0) {
        throw Error(ErrorKind::kUsage, fmt::format("--sequences {} must divide --tokens {}",
                                                   o.num_sequences, o.tokens));
    }
    MoeLayerParams params = make_moe_layer_params(cfg);
    init_moe_layer_params(params, o.seed, o.init_std);
    if (cfg.enable_expert_bias) {
        fill_normal(params.router.expert_bias, random_bits(o.seed, 2000), 0.0f, 0.1f);
    }
    const Tensor x = activation(cfg, o.tokens, random_bits(o.seed, 1000));
    const Tensor dy = activation(cfg, o.tokens, random_bits(o.seed, 1001));
    Tensor y = Tensor::empty(x.shape(), x.dtype());
    Tensor dx = Tensor::empty(x.shape(), x.dtype());
    MoeContext ctx;
    const MoeLosses losses = moe_forward(cfg, params, x, o.num_sequences, ctx, y);
    moe_backward(cfg, params, dy, 1.0f, ctx, dx);

    std::vector<io::NamedTensor> out = {{"x", widened(x)}, {"dy", widened(dy)}};
    std::vector<Param*> weights = moe_layer_param_list(params);
    for (Param* p : weights) {
        const bool master = p == &params.router.weight && cfg.router_fp32;
        out.push_back({p->name, widened(master ? p->master : p->compute)});
        if (p == &params.router.weight && cfg.enable_expert_bias) {
            out.push_back({"router.expert_bias", params.router.expert_bias.clone()});
        }
    }
    out.push_back({"y", widened(y)});
    out.push_back({"aux_loss", scalar(losses.aux_loss)});
    out.push_back({"z_loss", scalar(losses.z_loss)});
    out.push_back({"dx", widened(dx)});
    for (Param* p : weights) {
        out.push_back({p->name + ".grad", p->main_grad});
    }

    std::map<std::string, std::string> meta = o.metadata;
    meta["tokens"] = std::to_string(o.tokens);
    meta["sequences"] = std::to_string(o.num_sequences);
    meta["seed"] = std::to_string(o.seed);
    meta["precision"] = precision_name(cfg.precision);
    meta["loss"] = "sum(y * dy) + aux_loss + z_loss";
    meta["producer"] = std::string("epo ") + EPO_VERSION;
    io::write_safetensors(o.path, out, meta);
    return MoeLayerDumpResult{losses, static_cast<int>(out.size()), ctx.plan.num_dropped};
}

}  // namespace epo::moe
