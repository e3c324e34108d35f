#include "loom/dist/parallel_state.h"

#include <fmt/format.h>

#include <stdexcept>

namespace loom::dist {

std::string ParallelState::key(const std::vector<Axis>& axes) {
  std::string out;
  for (Axis axis : axes) out += (out.empty() ? "" : "-") + axis_name(axis);
  return out;
}

ParallelState::ParallelState(std::shared_ptr<Comm> world, GridSizes sizes)
    : world_(std::move(world)), grid_(sizes, world_->size()) {
  const int64_t rank = world_->rank();
  for (auto axes : std::vector<std::vector<Axis>>{{Axis::tp},
                                                  {Axis::cp},
                                                  {Axis::dp},
                                                  {Axis::pp},
                                                  {Axis::ep},
                                                  {Axis::edp},
                                                  {Axis::dp, Axis::cp},
                                                  {Axis::tp, Axis::pp}}) {
    const std::vector<int64_t> members = grid_.group_of(rank, axes);
    // A group of every rank is the world itself: no second process group over the same ranks.
    if (static_cast<int64_t>(members.size()) == world_->size()) {
      groups_[key(axes)] = world_;
      continue;
    }
    // Named by the axes and the group's lowest rank: the same name on every member.
    groups_[key(axes)] = world_->subgroup(fmt::format("{}.{}", key(axes), members.front()), members);
  }
}

const std::shared_ptr<Comm>& ParallelState::axis(Axis axis, int64_t size) const {
  static const std::shared_ptr<Comm> none;
  return world_ && size > 1 ? group({axis}) : none;
}

const std::shared_ptr<Comm>& ParallelState::data() const {
  static const std::shared_ptr<Comm> none;
  return world_ ? group({Axis::dp, Axis::cp}) : none;
}

const std::shared_ptr<Comm>& ParallelState::group(const std::vector<Axis>& axes) const {
  const auto it = groups_.find(key(axes));
  if (it == groups_.end()) throw std::out_of_range("no process group over " + key(axes));
  return it->second;
}

}  // namespace loom::dist
