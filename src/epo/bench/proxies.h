// The bench proxies: small models with the real layer widths of recipes too large for a CPU
// host, as YAML layers over their recipes (so harness flags and KEY=VALUE still win), and the
// choice of what `epo bench` and `epo plan` run when the user names no configuration file.
// Why a proxy keeps what it keeps is written above each one (docs/bench.md "The embedded
// default: a proxy of qwen3-30b-a3b", "A proxy of deepseek-v3").
#pragma once

#include <string>

#include "epo/config/builder.h"

namespace epo::bench {

// The embedded default (no --model, no config file): a small proxy of qwen3-30b-a3b with its
// real layer widths.
extern const char* const kProxyRecipe;
const std::string& proxy_yaml();
// The proxy of deepseek-v3 (docs/bench.md "A proxy of deepseek-v3"), built the same way.
const std::string& deepseek_v3_proxy_yaml();
// The bench proxy of a recipe, or nullptr for a recipe that has none.
const std::string* bench_proxy_yaml(const std::string& recipe);
// `sources` with the proxy layer added when they name neither a model nor a config file (epo
// plan's default as well as epo bench's).
config::ConfigSources with_default_model(config::ConfigSources sources, bool* is_proxy = nullptr);
// What epo bench runs: with a config file, or a model without a proxy, `sources` as they are;
// with no model the qwen3-30b-a3b proxy, with a model that has a proxy (qwen3-30b-a3b,
// deepseek-v3; the full models cannot fit on a CPU host) its proxy.
config::ConfigSources with_bench_model(config::ConfigSources sources, bool* is_proxy = nullptr);

}  // namespace epo::bench
