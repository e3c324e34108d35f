#include "loom/util/spelling.h"

#include <fmt/format.h>

#include <algorithm>

namespace loom {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string did_you_mean(const std::string& unknown, const std::vector<std::string>& valid) {
  const std::string* best = nullptr;
  size_t best_distance = 3;
  for (const auto& name : valid) {
    const size_t d = edit_distance(unknown, name);
    if (d < best_distance) best = &name, best_distance = d;
  }
  return best ? fmt::format("; did you mean '{}'?", *best) : "";
}

}  // namespace loom
