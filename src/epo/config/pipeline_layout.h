// Which transformer layers each pipeline stage and model chunk holds, from the configuration:
// one function for the planner (and, later, the runtime), with Megatron-Core's rules
// (TransformerConfig's pipeline checks, PipelineParallelLayerLayout).
//
// Four ways to say it, at most one per configuration:
//   even             L / (PP VPP) layers per model chunk (the default)
//   first / last     num_layers_in_first_pipeline_stage and / or ..._last_...: those stages hold
//                    that many layers (split evenly over their VPP chunks), the middle stages
//                    share the rest evenly
//   account_for_*    account_for_embedding_in_pipeline_split / ..._loss_...: the embedding and /
//                    or the loss count as one layer each; the L + e + l slots split evenly, so
//                    the first model chunk holds one layer fewer (embedding), the last one fewer
//                    (loss)
//   layout string    pipeline_model_parallel_layout, Megatron's notation: stages separated by
//                    '|', each a list of E (embedding), t (transformer layer), m (MTP layer), L
//                    (loss); "(...)*n" repeats a group n times. PP x VPP segments: segment i is
//                    model chunk i / PP of stage i % PP.
// Model chunks are numbered as the interleaved schedule runs them: chunk c of every stage before
// chunk c + 1 of any, so layers are consecutive in (chunk, stage) order.
//
// The rules (errors name the field, the value and the fix; validation reports them as LY005):
//   - uneven first / last and account_for_* do not mix, and neither mixes with a layout string;
//   - first / last > 0, divisible by VPP; the middle stages' layers divisible by their count and
//     each middle stage's by VPP; no middle stage means no layers left over;
//   - account_for_*: L + e + l divisible by PP, and per stage by VPP;
//   - even: L divisible by PP x VPP;
//   - layout: balanced parentheses, "*n" with n >= 1 after a group, only E t m L | ( ) * and
//     digits; a segment count that is a multiple of PP (VPP = segments / PP, equal to a VPP that
//     is set); exactly L t's, mtp_num_layers m's (all on the last stage); E in the first segment
//     only, L in the last only.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "epo/config/finding.h"
#include "epo/config/model_config.h"

namespace epo::config {

struct ModelChunk {
    int first_layer = 0;  // the first transformer layer it holds (layers are consecutive)
    int num_layers = 0;
    bool embedding = false;  // holds the embedding
    bool loss = false;       // holds the output layer and the loss
    int num_mtp_layers = 0;  // multi-token-prediction layers it holds
};

struct PipelineLayout {
    int num_stages = 1;                           // PP
    int num_chunks = 1;                           // VPP (1 without)
    std::vector<std::vector<ModelChunk>> chunks;  // [stage][chunk]
    bool even = true;  // every chunk L / (PP VPP) layers, embedding and loss not counted

    int stage_layers(int stage) const;
};

// The error of a configuration whose split breaks a rule above, as a finding with id LY005.
std::optional<Finding> check_pipeline_layout(const ModelConfig& m);

// Raises Error(kConfig) with check_pipeline_layout's message.
PipelineLayout pipeline_layout(const ModelConfig& m);

}  // namespace epo::config
