// The one parallel state of a job: the rank grid (tp, cp, ep, dp, pp) and this rank's process group
// over each axis combination the parallel modes use. Model building, tasks, the plan, the schedules,
// bench and the trainer read it; none keeps a copy of a group or a size.
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
  // One process: every axis of one rank, no groups.
  ParallelState() : grid_(GridSizes{}, 1) {}
  // Forms this rank's groups over tp, cp, dp, pp, ep, edp, dp x cp (gradient sums) and tp x pp
  // (model parallel). Every rank of `world` calls it, with the same sizes; groups are formed in
  // one order everywhere. ConfigError when the sizes do not fit the world.
  ParallelState(std::shared_ptr<Comm> world, GridSizes sizes);

  const RankGrid& grid() const { return grid_; }
  const GridSizes& sizes() const { return grid_.sizes(); }
  const std::shared_ptr<Comm>& world() const { return world_; }  // null: one process
  int64_t world_size() const { return world_ ? world_->size() : 1; }
  bool is_main() const { return !world_ || world_->rank() == 0; }

  // This rank's group along one axis; null for one process, or when the axis has one rank.
  const std::shared_ptr<Comm>& tp() const { return axis(Axis::tp, sizes().tp); }
  const std::shared_ptr<Comm>& cp() const { return axis(Axis::cp, sizes().cp); }
  const std::shared_ptr<Comm>& pp() const { return axis(Axis::pp, sizes().pp); }
  const std::shared_ptr<Comm>& ep() const { return axis(Axis::ep, sizes().ep); }
  // The data-parallel x context-parallel group gradients are summed over and the data is shared out
  // over (null for one process).
  const std::shared_ptr<Comm>& data() const;
  // This rank's group over `axes` (one of the combinations above; std::out_of_range otherwise, and
  // for one process).
  const std::shared_ptr<Comm>& group(const std::vector<Axis>& axes) const;

 private:
  const std::shared_ptr<Comm>& axis(Axis axis, int64_t size) const;
  static std::string key(const std::vector<Axis>& axes);
  std::shared_ptr<Comm> world_;
  RankGrid grid_;
  std::map<std::string, std::shared_ptr<Comm>> groups_;
};

}  // namespace loom::dist
