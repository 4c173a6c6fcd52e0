// Suggestions for mistyped names on the command line: the closest subcommand to `epo trian`, the
// closest flag to `--max_step`. Plain edit distance; a suggestion only when it is close enough to
// be a typo (at most a third of the name's letters changed, and at most 3).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace epo::cli {

// Edit distance with adjacent transpositions (insertions, deletions, substitutions and swaps of
// two neighbouring letters cost 1: "trian" is 1 from "train").
int edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `typed`, if it is close enough to be a typo.
std::optional<std::string> closest_name(std::string_view typed,
                                        const std::vector<std::string>& candidates);

}  // namespace epo::cli
