// Rank groups against layouts worked by hand from rank = tp_i + tp*(cp_i + cp*(dp_i + dp*pp_i)).
#include "loom/dist/rank_grid.h"

#include <gtest/gtest.h>

#include <stdexcept>

#include "loom/util/errors.h"

namespace loom::dist {
namespace {

using Groups = std::vector<std::vector<int64_t>>;

TEST(RankGrid, SixteenRanksWithEveryAxisOfTwo) {
  const RankGrid grid({/*tp=*/2, /*cp=*/2, /*ep=*/2, /*dp=*/2, /*pp=*/2}, 16);
  EXPECT_EQ(grid.groups({Axis::tp}),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(grid.groups({Axis::cp}),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(grid.groups({Axis::dp}),
            (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(grid.groups({Axis::pp}),
            (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  // Gradients are summed over dp x cp.
  EXPECT_EQ(grid.groups({Axis::dp, Axis::cp}),
            (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(grid.group_of(13, {Axis::tp, Axis::pp}), (std::vector<int64_t>{4, 5, 12, 13}));
  // ep = 2 of cp*dp = 4: experts on neighbouring cp-dp places (here the cp pairs), their data
  // parallelism across the rest.
  EXPECT_EQ(grid.group_of(0, {Axis::ep}), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(grid.group_of(0, {Axis::edp}), (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(grid.index(13, Axis::tp), 1);
  EXPECT_EQ(grid.index(13, Axis::cp), 0);
  EXPECT_EQ(grid.index(13, Axis::dp), 1);
  EXPECT_EQ(grid.index(13, Axis::pp), 1);
}

TEST(RankGrid, ExpertsSpanDataParallelRanksWhenThereIsNoContextParallelism) {
  // tp 2, dp 4, ep 4: each (tp) slice's 4 data-parallel ranks hold the 4 experts.
  const RankGrid grid({/*tp=*/2, /*cp=*/1, /*ep=*/4, /*dp=*/4, /*pp=*/1}, 8);
  EXPECT_EQ(grid.groups({Axis::ep}), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(grid.groups({Axis::edp}), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  // ep 2 of dp 4: pairs of neighbouring data-parallel ranks.
  const RankGrid pairs({1, 1, 2, 4, 1}, 4);
  EXPECT_EQ(pairs.groups({Axis::ep}), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(pairs.groups({Axis::edp}), (Groups{{0, 2}, {1, 3}}));
}

TEST(RankGrid, DataParallelOnlyIsOneGroup) {
  const RankGrid grid({}, 1);
  EXPECT_EQ(grid.groups({Axis::dp}), (Groups{{0}}));
  const RankGrid four({1, 1, 1, 4, 1}, 4);
  EXPECT_EQ(four.groups({Axis::dp, Axis::cp}), (Groups{{0, 1, 2, 3}}));
  EXPECT_EQ(four.groups({Axis::tp}), (Groups{{0}, {1}, {2}, {3}}));
}

TEST(RankGrid, RefusesLayoutsThatDoNotFit) {
  EXPECT_THROW(RankGrid({2, 1, 1, 2, 1}, 8), ConfigError);  // 2*2 != 8
  EXPECT_THROW(RankGrid({1, 1, 3, 4, 1}, 4), ConfigError);  // ep 3 does not divide 4
  EXPECT_THROW(RankGrid({0, 1, 1, 4, 1}, 4), ConfigError);
  const RankGrid grid({1, 2, 2, 2, 1}, 4);
  EXPECT_THROW(grid.groups({Axis::ep, Axis::dp}), std::invalid_argument);
  EXPECT_THROW(grid.index(4, Axis::tp), std::out_of_range);
}

}  // namespace
}  // namespace loom::dist
