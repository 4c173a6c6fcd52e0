// How long configuration work takes (the bar: validation in milliseconds, so a config
// is checked before a job waits in a queue). Measures validate() on the recipes with EP overlap
// asked for, building a config from YAML text plus overrides, and the YAML dump.
//   build/release/bench/config_validate_bench --benchmark_repetitions=5
#include <benchmark/benchmark.h>

#include "epo/config/builder.h"
#include "epo/config/harness.h"
#include "epo/config/recipes.h"
#include "epo/config/validate.h"
#include "epo/config/yaml_io.h"

namespace epo::config {
namespace {

Config overlap_recipe(std::string_view name) {
    Config c = make_recipe(name);
    HarnessOverrides h;
    h.moe_a2a_overlap = true;
    h.expert_model_parallel_size = 8;
    h.gpus_per_node = 8;
    apply_harness_overrides(c, h);
    return c;
}

void BM_Validate(benchmark::State& state, std::string_view recipe) {
    const Config c = overlap_recipe(recipe);
    for (auto _ : state) {
        ValidationReport report = validate(c);
        benchmark::DoNotOptimize(report);
    }
}
BENCHMARK_CAPTURE(BM_Validate, tiny_moe, "tiny-moe")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Validate, deepseek_v3, "deepseek-v3")->Unit(benchmark::kMicrosecond);

void BM_BuildFromYaml(benchmark::State& state) {
    ConfigSources sources;
    sources.config_text = to_yaml(overlap_recipe("qwen3-30b-a3b"));
    sources.harness.tensor_model_parallel_size = 1;
    sources.overrides = {"model.num_layers=8", "comm_overlap.delay_wgrad_compute=true"};
    for (auto _ : state) {
        BuiltConfig built = build_config(sources);
        benchmark::DoNotOptimize(built);
    }
}
BENCHMARK(BM_BuildFromYaml)->Unit(benchmark::kMicrosecond);

void BM_DumpYaml(benchmark::State& state) {
    const Config c = overlap_recipe("deepseek-v3");
    for (auto _ : state) {
        std::string yaml = to_yaml(c);
        benchmark::DoNotOptimize(yaml);
    }
}
BENCHMARK(BM_DumpYaml)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace epo::config

BENCHMARK_MAIN();
