// Named, complete configurations users start from (docs/recipes.md): qwen3-30b-a3b,
// qwen3-235b-a22b, deepseek-v3, mixtral-8x7b and our own tiny-moe. They are compiled in, so a
// binary needs no data files. Every later layer (YAML, harness flags, dotted overrides)
// overrides a recipe's values; see builder.h for the order.
#pragma once

#include <string_view>
#include <vector>

#include "epo/config/config.h"

namespace epo::config {

const std::vector<std::string_view>& recipe_names();

// The recipe's configuration, with Config::recipe set to its name. An unknown name raises
// ErrorKind::kUsage listing the known ones (and the closest one).
Config make_recipe(std::string_view name);

}  // namespace epo::config
