// Which ranks form each parallel group: Megatron's rank order tp-cp-ep-dp-pp. A rank is
//   rank = tp_i + tp * (cp_i + cp * (dp_i + dp * pp_i)),
// so tensor-parallel peers are neighbours and pipeline stages are furthest apart. Expert
// parallelism is carved from the cp x dp ranks of each (tp, pp) slice: numbering those cp-fastest
// as c = cp_i + cp * dp_i, a rank's expert index is ep_i = c % ep and its expert-data-parallel
// index edp_i = c / ep (so experts sit on neighbouring ranks, as in Megatron's expert rank order
// tp-ep-dp-pp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace loom::dist {

enum class Axis { tp, cp, dp, pp, ep, edp };

std::string axis_name(Axis axis);

struct GridSizes {
  int64_t tp = 1, cp = 1, ep = 1, dp = 1, pp = 1;
};

class RankGrid {
 public:
  // ConfigError unless tp * cp * dp * pp == world and ep divides cp * dp (every size >= 1).
  RankGrid(GridSizes sizes, int64_t world);

  const GridSizes& sizes() const { return sizes_; }
  int64_t world() const { return world_; }
  // The rank's index along an axis.
  int64_t index(int64_t rank, Axis axis) const;
  // The ranks that differ from `rank` only along `axes` (e.g. {Axis::dp, Axis::cp}: the ranks that
  // sum gradients together), in increasing order. Expert axes (ep, edp) combine with tp and pp
  // only: mixing them with cp or dp is a std::invalid_argument.
  std::vector<int64_t> group_of(int64_t rank, const std::vector<Axis>& axes) const;
  // Every such group, ordered by its lowest rank.
  std::vector<std::vector<int64_t>> groups(const std::vector<Axis>& axes) const;

 private:
  GridSizes sizes_;
  int64_t world_ = 1;
};

}  // namespace loom::dist
