#include "epo/config/fp8_rules.h"

#include <fmt/format.h>

#include <string>

namespace epo::config {

std::vector<Finding> check_fp8(const ModelConfig& m, std::string_view gpu) {
    std::vector<Finding> out;
    const std::string& r = m.fp8_recipe;
    if (r != "delayed" && r != "tensorwise" && r != "mxfp8" && r != "blockwise") {
        out.push_back({"FP002", "model.fp8_recipe", r, "not a Transformer Engine fp8 recipe",
                       "use delayed, tensorwise, mxfp8 (Blackwell) or blockwise"});
    }
    if (!m.fp8)
        return out;
    if (*m.fp8 != "e4m3" && *m.fp8 != "hybrid") {
        out.push_back({"FP001", "model.fp8", *m.fp8, "not an fp8 format",
                       "use e4m3 (every tensor) or hybrid (e4m3 forward, e5m2 gradients), or "
                       "null for no fp8"});
    }
    const bool hopper = gpu.rfind("h100", 0) == 0 || gpu.rfind("h200", 0) == 0 ||
                        gpu.find("H100") != std::string_view::npos ||
                        gpu.find("H200") != std::string_view::npos;
    if (r == "mxfp8" && hopper) {
        out.push_back({"FP003", "model.fp8_recipe", r,
                       fmt::format("MXFP8 block scales need Blackwell tensor cores; env.gpu {} is "
                                   "a Hopper part",
                                   gpu),
                       "use tensorwise or blockwise on Hopper, or plan for b200 / gb200"});
    }
    if (!m.bf16 && !m.fp16) {
        out.push_back({"FP004", "model.fp8", *m.fp8,
                       "fp8 GEMMs run inside bf16 (or fp16) training; the model trains in fp32",
                       "set model.bf16=true"});
    }
    return out;
}

}  // namespace epo::config
