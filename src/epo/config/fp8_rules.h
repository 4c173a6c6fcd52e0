// The fp8 settings' rules (model.fp8, model.fp8_recipe), as Megatron-Core and Transformer Engine
// take them:
//   FP001  model.fp8 is e4m3 or hybrid (null: no fp8)
//   FP002  model.fp8_recipe is delayed, tensorwise, mxfp8 or blockwise
//   FP003  mxfp8 scales need Blackwell tensor cores (b200, gb200), not a Hopper env.gpu
//   FP004  fp8 runs on bf16 (or fp16) training: model.bf16 or model.fp16
// Deliberately not checked here: the Transformer Engine version each recipe needs.
#pragma once

#include <string_view>
#include <vector>

#include "epo/config/finding.h"
#include "epo/config/model_config.h"

namespace epo::config {

std::vector<Finding> check_fp8(const ModelConfig& m, std::string_view gpu);

}  // namespace epo::config
