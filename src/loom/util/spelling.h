// Suggesting the name a user probably meant: for unknown config keys, dataset names and the like.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace loom {

// Levenshtein distance: the fewest single-character insertions, deletions and substitutions
// turning a into b.
size_t edit_distance(const std::string& a, const std::string& b);

// "; did you mean 'lr'?" when one of `valid` is fewer than 3 edits from `unknown` (the nearest, the
// first of equals), else "".
std::string did_you_mean(const std::string& unknown, const std::vector<std::string>& valid);

}  // namespace loom
