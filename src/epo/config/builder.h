// Building a run's configuration from its sources, in precedence order (later wins):
//
//   1. the recipe: --model NAME, or `recipe: NAME` in the YAML file (naming two different
//      recipes is a usage error);
//   2. the YAML file's values (keys absent from the file keep the recipe's values); a file that
//      Megatron-Bridge wrote (run_config.yaml, `_target_` tags) is translated first
//      (bridge_io.h), and the keys EPO does not use are listed in `notes`;
//   3. the harness flags, in the fixed order of harness.h (A2A-overlap shortcut, topology and
//      max_steps, parallel sizes, batch/sequence/shape, flex backend last);
//   4. dotted KEY=VALUE overrides, left to right (the most specific layer); Megatron-LM's flags
//      come first among them, as the overrides of the fields they name;
//   5. Megatron-LM's --num-layers-per-virtual-pipeline-stage, turned into the virtual pipeline
//      size once num_layers and PP are final.
//
// One exception keeps the flex activation honest: `env.*` overrides are applied before step 3
// as well (and again in step 4), so the activation probes the device the user named on the
// command line.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "epo/config/config.h"
#include "epo/config/devices.h"
#include "epo/config/finding.h"
#include "epo/config/harness.h"

namespace epo::config {

struct ConfigSources {
    std::optional<std::string> model;                  // --model NAME
    std::optional<std::filesystem::path> config_path;  // CONFIG.yaml
    std::optional<std::string> config_text;            // YAML text instead of a file (tests)
    HarnessOverrides harness;
    std::vector<std::string> overrides;  // KEY=VALUE
    // Megatron-LM's --num-layers-per-virtual-pipeline-stage N, applied last (it needs the final
    // num_layers and PP): virtual_pipeline_model_parallel_size = num_layers / (PP x N).
    std::optional<int> num_layers_per_virtual_pipeline_stage;
    DeviceProbe probe;  // empty: the table probe of env.gpu
};

struct BuiltConfig {
    Config config;                   // as the user asked, not yet finalized (see validate.h)
    std::vector<Finding> warnings;   // from the flex activation step
    std::vector<std::string> notes;  // reading a Megatron-Bridge file: keys not used, overlap
};

// Raises kUsage for a missing recipe and config, unknown recipe/keys, malformed YAML or wrong
// types; kIo for an unreadable file; kConfig when the flex activation's device probe fails.
BuiltConfig build_config(const ConfigSources& sources);

}  // namespace epo::config
