// ParallelState across real processes: this test runs as 4 ranks under `loom run -n 4`
// (tests/e2e/parallel_state.sh); alone it is skipped. With tp 2 x dp 2 (ep 2), each group's sum
// of (world rank + 1) must be the sum over the members RankGrid lists, and each group's size and
// rank must match its place in the grid.
#include "loom/dist/parallel_state.h"

#include <gtest/gtest.h>

#include "loom_run_world.h"

namespace loom::dist {
namespace {

TEST(ParallelStateUnderLoomRun, EachGroupSumsOverTheRanksOfItsAxes) {
  const auto world = loom_run_world();
  if (!world) GTEST_SKIP() << "needs 4 ranks: loom run -n 4 -- loom_dist_tests";
  const ParallelState state(world, {/*tp=*/2, /*cp=*/1, /*ep=*/2, /*dp=*/2, /*pp=*/1});
  const int64_t rank = world->rank();
  for (auto axes : std::vector<std::vector<Axis>>{
           {Axis::tp}, {Axis::dp}, {Axis::ep}, {Axis::edp}, {Axis::dp, Axis::cp}, {Axis::tp, Axis::pp}}) {
    const std::vector<int64_t> members = state.grid().group_of(rank, axes);
    const auto& comm = state.group(axes);
    ASSERT_EQ(comm->size(), static_cast<int64_t>(members.size()));
    EXPECT_EQ(members[comm->rank()], rank);
    at::Tensor value = at::full({3}, static_cast<double>(rank + 1), at::kDouble);
    comm->all_reduce_sum({value});
    double want = 0;
    for (int64_t m : members) want += static_cast<double>(m + 1);
    EXPECT_TRUE(value.equal(at::full({3}, want, at::kDouble)))
        << "rank " << rank << ", group of size " << members.size();
  }
  // tp 2 x dp 2: rank 1's tensor-parallel peer is 0, its data-parallel peer 3.
  EXPECT_EQ(state.grid().group_of(1, {Axis::tp}), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(state.grid().group_of(1, {Axis::dp}), (std::vector<int64_t>{1, 3}));
  state.world()->barrier();
}

}  // namespace
}  // namespace loom::dist
