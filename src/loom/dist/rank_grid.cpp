#include "loom/dist/rank_grid.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "loom/util/errors.h"

namespace loom::dist {
namespace {

bool has(const std::vector<Axis>& axes, Axis axis) {
  return std::find(axes.begin(), axes.end(), axis) != axes.end();
}

bool expert_axes(const std::vector<Axis>& axes) {
  const bool expert = has(axes, Axis::ep) || has(axes, Axis::edp);
  if (expert && (has(axes, Axis::cp) || has(axes, Axis::dp)))
    throw std::invalid_argument("rank groups: ep and edp combine with tp and pp only, not with cp or dp");
  return expert;
}

}  // namespace

std::string axis_name(Axis axis) {
  switch (axis) {
    case Axis::tp:
      return "tp";
    case Axis::cp:
      return "cp";
    case Axis::dp:
      return "dp";
    case Axis::pp:
      return "pp";
    case Axis::ep:
      return "ep";
    case Axis::edp:
      return "edp";
  }
  return "?";
}

RankGrid::RankGrid(GridSizes sizes, int64_t world) : sizes_(sizes), world_(world) {
  const auto& s = sizes;
  if (s.tp < 1 || s.cp < 1 || s.ep < 1 || s.dp < 1 || s.pp < 1)
    throw ConfigError(fmt::format("parallel sizes must be >= 1, got tp {} cp {} ep {} dp {} pp {}", s.tp,
                                  s.cp, s.ep, s.dp, s.pp));
  if (s.tp * s.cp * s.dp * s.pp != world)
    throw ConfigError(fmt::format("parallel: tp*cp*dp*pp = {}*{}*{}*{} = {} does not equal the world size {}",
                                  s.tp, s.cp, s.dp, s.pp, s.tp * s.cp * s.dp * s.pp, world));
  if ((s.cp * s.dp) % s.ep != 0)
    throw ConfigError(
        fmt::format("parallel.ep={} does not divide cp*dp = {}*{} = {}", s.ep, s.cp, s.dp, s.cp * s.dp));
}

int64_t RankGrid::index(int64_t rank, Axis axis) const {
  if (rank < 0 || rank >= world_)
    throw std::out_of_range(fmt::format("rank {} is outside the world of {}", rank, world_));
  const auto& s = sizes_;
  const int64_t tp_i = rank % s.tp, cp_i = rank / s.tp % s.cp, dp_i = rank / (s.tp * s.cp) % s.dp;
  const int64_t c = cp_i + s.cp * dp_i;  // place among the cp x dp ranks of this (tp, pp) slice
  switch (axis) {
    case Axis::tp:
      return tp_i;
    case Axis::cp:
      return cp_i;
    case Axis::dp:
      return dp_i;
    case Axis::pp:
      return rank / (s.tp * s.cp * s.dp);
    case Axis::ep:
      return c % s.ep;
    case Axis::edp:
      return c / s.ep;
  }
  return 0;
}

std::vector<int64_t> RankGrid::group_of(int64_t rank, const std::vector<Axis>& axes) const {
  const bool expert = expert_axes(axes);
  // The axes that stay fixed within the group.
  const std::vector<Axis> system = expert ? std::vector<Axis>{Axis::tp, Axis::ep, Axis::edp, Axis::pp}
                                          : std::vector<Axis>{Axis::tp, Axis::cp, Axis::dp, Axis::pp};
  std::vector<int64_t> out;
  for (int64_t other = 0; other < world_; ++other) {
    bool same = true;
    for (Axis axis : system)
      if (!has(axes, axis) && index(other, axis) != index(rank, axis)) same = false;
    if (same) out.push_back(other);
  }
  return out;
}

std::vector<std::vector<int64_t>> RankGrid::groups(const std::vector<Axis>& axes) const {
  std::vector<std::vector<int64_t>> out;
  std::vector<bool> placed(static_cast<size_t>(world_), false);
  for (int64_t rank = 0; rank < world_; ++rank) {
    if (placed[static_cast<size_t>(rank)]) continue;
    out.push_back(group_of(rank, axes));
    for (int64_t member : out.back()) placed[static_cast<size_t>(member)] = true;
  }
  return out;
}

}  // namespace loom::dist
