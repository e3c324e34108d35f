// The process groups of a parallel layout: for each axis combination a later feature needs, the
// group of ranks (RankGrid) that holds this rank, as a Comm of its own.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loom/dist/comm.h"
#include "loom/dist/rank_grid.h"

namespace loom::dist {

class ParallelState {
 public:
  // Forms this rank's groups over tp, cp, dp, pp, ep, edp, dp x cp (gradient sums) and tp x pp
  // (model parallel). Every rank of `world` calls it, with the same sizes; groups are formed in
  // one order everywhere. ConfigError when the sizes do not fit the world.
  ParallelState(std::shared_ptr<Comm> world, GridSizes sizes);

  const RankGrid& grid() const { return grid_; }
  const std::shared_ptr<Comm>& world() const { return world_; }
  // This rank's group over `axes` (one of the combinations above; std::out_of_range otherwise).
  const std::shared_ptr<Comm>& group(const std::vector<Axis>& axes) const;

 private:
  static std::string key(const std::vector<Axis>& axes);
  std::shared_ptr<Comm> world_;
  RankGrid grid_;
  std::map<std::string, std::shared_ptr<Comm>> groups_;
};

}  // namespace loom::dist
