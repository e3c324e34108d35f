// A step's samples into micro-batches: balanced across data-parallel ranks, longest first, padded
// or packed.
#include "loom/data/batching.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "loom/util/errors.h"
#include "loom/util/random.h"

namespace loom::data {
namespace {

TokenizedExample example(int64_t tokens, int64_t grid_h = 0, int64_t grid_w = 0) {
  TokenizedExample ex;
  ex.input_ids.assign(tokens, 7);
  ex.labels.assign(tokens, kIgnoreIndex);
  ex.labels.back() = 7;
  ex.answer = std::to_string(tokens);
  if (grid_h > 0) {
    VisionInput image;
    image.grid_thw = {1, grid_h, grid_w};
    image.pixel_values = at::zeros({grid_h * grid_w, 1176});
    ex.images.push_back(image);
  }
  return ex;
}

TEST(BalanceAcrossRanks, WorkedByHand) {
  // Tokens only, 34 in all: a fair part is 17. Taken largest first, each to the lighter result:
  //   9 -> r0 (9 vs 9, tie to the lower rank)   r0 9
  //   7 -> r1 (16 vs 7)                          r1 7
  //   6 -> r1 (15 vs 13)                         r1 13
  //   5 -> r0 (14 vs 18)                         r0 14
  //   4 -> r1 (18 vs 17)                         r1 17, full (3 items)
  //   3 -> r0 (the only room)                    r0 17
  const std::vector<SampleCost> costs = {{4, 0}, {9, 0}, {3, 0}, {7, 0}, {6, 0}, {5, 0}};
  const auto ranks = balance_across_ranks(costs, 2);
  EXPECT_EQ(ranks[0], (std::vector<size_t>{1, 2, 5}));  // 9 + 3 + 5 = 17
  EXPECT_EQ(ranks[1], (std::vector<size_t>{0, 3, 4}));  // 4 + 7 + 6 = 17
}

TEST(BalanceAcrossRanks, EqualCountsAndLoadsWithinTheLargestItem) {
  CounterRng rng(3, 0, 0);
  std::vector<SampleCost> costs(64);
  for (auto& c : costs) c = {20 + rng.below(400), rng.below(3) == 0 ? 0 : 16 * (1 + rng.below(16))};
  for (int64_t ranks : {1, 2, 4, 8}) {
    const auto split = balance_across_ranks(costs, ranks);
    ASSERT_EQ(split.size(), static_cast<size_t>(ranks));
    std::vector<size_t> all;
    std::vector<int64_t> tokens, patches;
    for (const auto& items : split) {
      EXPECT_EQ(items.size(), 64u / ranks);
      EXPECT_TRUE(std::is_sorted(items.begin(), items.end()));
      all.insert(all.end(), items.begin(), items.end());
      int64_t t = 0, p = 0;
      for (size_t i : items) t += costs[i].tokens, p += costs[i].patches;
      tokens.push_back(t);
      patches.push_back(p);
    }
    std::sort(all.begin(), all.end());
    std::vector<size_t> expected(64);
    std::iota(expected.begin(), expected.end(), size_t{0});
    EXPECT_EQ(all, expected) << "every item exactly once";
    // The busiest rank's load, in fair parts of tokens or patches, whichever is higher.
    auto worst = [&](const std::vector<int64_t>& t, const std::vector<int64_t>& p) {
      const double fair_t = std::accumulate(t.begin(), t.end(), 0.0) / ranks;
      const double fair_p = std::accumulate(p.begin(), p.end(), 0.0) / ranks;
      return std::max(*std::max_element(t.begin(), t.end()) / fair_t,
                      *std::max_element(p.begin(), p.end()) / fair_p);
    };
    // A plain split in order, as a sampler without balancing would make.
    std::vector<int64_t> in_order_t(ranks, 0), in_order_p(ranks, 0);
    for (size_t i = 0; i < costs.size(); ++i) {
      in_order_t[i / (64 / ranks)] += costs[i].tokens;
      in_order_p[i / (64 / ranks)] += costs[i].patches;
    }
    // Measured here: 1.010, 1.037, 1.041 balanced against 1.037, 1.152, 1.512 in order (2, 4, 8).
    EXPECT_LE(worst(tokens, patches), 1.05) << ranks << " ranks";
    EXPECT_LE(worst(tokens, patches), worst(in_order_t, in_order_p)) << ranks << " ranks";
    EXPECT_EQ(balance_across_ranks(costs, ranks), split) << "deterministic";
  }
  EXPECT_THROW(balance_across_ranks(costs, 0), DataError);
}

TEST(MakeMicroBatches, LongestFirstPaddedOrPacked) {
  std::vector<TokenizedExample> examples = {example(5, 2, 2), example(9), example(5), example(12, 2, 4)};
  const auto padded = make_micro_batches(examples, {2, false, 0});
  ASSERT_EQ(padded.size(), 2u);
  EXPECT_EQ(padded[0].answers, (std::vector<std::string>{"12", "9"}));
  EXPECT_EQ(padded[1].answers, (std::vector<std::string>{"5", "5"}));  // stable: 5 with image first
  EXPECT_EQ(padded[0].input_ids.sizes(), (std::vector<int64_t>{2, 12}));
  EXPECT_EQ(padded[1].input_ids.sizes(), (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(padded[1].image_grid_thw.size(0), 1);
  EXPECT_FALSE(padded[0].packed());

  const auto packed = make_micro_batches(examples, {4, true, 0});
  ASSERT_EQ(packed.size(), 1u);
  EXPECT_EQ(packed[0].cu_seqlens, (std::vector<int64_t>{0, 12, 21, 26, 31}));
  EXPECT_EQ(packed[0].sequence_lengths(), (std::vector<int64_t>{12, 9, 5, 5}));
  EXPECT_EQ(packed[0].num_target_tokens, 4);
  EXPECT_EQ(packed[0].pixel_values.size(0), 8 + 4);
  const auto uneven = make_micro_batches(examples, {3, false, 0});  // after a drop: 3 + 1
  ASSERT_EQ(uneven.size(), 2u);
  EXPECT_EQ(uneven[1].answers, (std::vector<std::string>{"5"}));
  EXPECT_THROW(make_micro_batches({}, {3, false, 0}), DataError);
}

TEST(Pack, ClearsEachSamplesFirstLabel) {
  TokenizedExample a = example(3), b = example(2);
  a.labels = {11, 12, 13};  // a first label is never a target, in a row of its own or packed
  b.labels = {21, 22};
  const Batch batch = pack({a, b});
  EXPECT_TRUE(batch.labels.equal(
      at::tensor(std::vector<int64_t>{kIgnoreIndex, 12, 13, kIgnoreIndex, 22}, at::kLong).view({1, 5})));
  EXPECT_EQ(batch.num_target_tokens, 3);
  EXPECT_TRUE(batch.attention_mask.equal(at::ones({1, 5}, at::kLong)));
  EXPECT_EQ(collate({a, b}, 0).num_target_tokens, 3);
}

TEST(TruncateExample, CutsTextAndNeverSplitsAnImage) {
  // ids: 1 [3 5 5 4] 1 1 [3 5 5 5 5 4] 1 ; 3 = vision start, 4 = vision end, two images.
  TokenizedExample ex;
  ex.input_ids = {1, 3, 5, 5, 4, 1, 1, 3, 5, 5, 5, 5, 4, 1};
  ex.labels = {-100, -100, -100, -100, -100, 11, 12, -100, -100, -100, -100, -100, -100, 13};
  ex.images.resize(2);
  ex.images[0].grid_thw = {1, 2, 4};
  ex.images[1].grid_thw = {1, 4, 4};

  TokenizedExample fits = ex;
  EXPECT_FALSE(truncate_example(fits, 14, 3, 4));
  EXPECT_EQ(fits.input_ids.size(), 14u);

  TokenizedExample inside = ex;  // a cut at 10 falls in the second image: it goes whole
  EXPECT_TRUE(truncate_example(inside, 10, 3, 4));
  EXPECT_EQ(inside.input_ids, (std::vector<int64_t>{1, 3, 5, 5, 4, 1, 1}));
  EXPECT_EQ(inside.labels, (std::vector<int64_t>{-100, -100, -100, -100, -100, 11, 12}));
  ASSERT_EQ(inside.images.size(), 1u);
  EXPECT_EQ(inside.images[0].grid_thw, (std::array<int64_t, 3>{1, 2, 4}));

  TokenizedExample after = ex;  // a cut at 13 keeps both images
  EXPECT_TRUE(truncate_example(after, 13, 3, 4));
  EXPECT_EQ(after.input_ids.size(), 13u);
  EXPECT_EQ(after.images.size(), 2u);

  TokenizedExample first = ex;  // a cut at 3 falls in the first image
  EXPECT_TRUE(truncate_example(first, 3, 3, 4));
  EXPECT_EQ(first.input_ids, (std::vector<int64_t>{1}));
  EXPECT_TRUE(first.images.empty());
}

TEST(TruncateExample, AVideoOfABlockPerTemporalPatchGoesWhole) {
  // ids: 1 [3 6 6 4] 1 [3 5 4] 9 [3 6 4] 9 [3 6 4] 1 ; 3 = vision start, 4 = vision end, 5 = image pad,
  // 6 = video pad: a one-block video of 2 tokens, an image, then a video of two temporal patches,
  // each after its time (9).
  TokenizedExample ex;
  ex.input_ids = {1, 3, 6, 6, 4, 1, 3, 5, 4, 9, 3, 6, 4, 9, 3, 6, 4, 1};
  ex.labels.assign(ex.input_ids.size(), -100);
  ex.images.resize(1);
  ex.images[0].grid_thw = {1, 2, 2};
  ex.videos.resize(2);
  ex.videos[0].grid_thw = {1, 2, 4};
  ex.videos[0].tokens = 2;
  ex.videos[1].grid_thw = {2, 2, 2};
  ex.videos[1].tokens = 2;

  TokenizedExample split = ex;  // a cut at 15 keeps the first patch of the second video: it goes whole
  EXPECT_TRUE(truncate_example(split, 15, 3, 4, 6));
  EXPECT_EQ(split.input_ids, (std::vector<int64_t>{1, 3, 6, 6, 4, 1, 3, 5, 4, 9}));
  EXPECT_EQ(split.images.size(), 1u);
  ASSERT_EQ(split.videos.size(), 1u);
  EXPECT_EQ(split.videos[0].grid_thw, (std::array<int64_t, 3>{1, 2, 4}));

  TokenizedExample whole = ex;  // a cut at 17 keeps both videos
  EXPECT_TRUE(truncate_example(whole, 17, 3, 4, 6));
  EXPECT_EQ(whole.input_ids.size(), 17u);
  EXPECT_EQ(whole.videos.size(), 2u);
}

// The smallest divisor of cp whose ranks hold the longest sample within the budget each and whose
// groups each get a sample; 0 when cp ranks cannot.
TEST(ContextDegree, SmallestDivisorThatHoldsTheLongestSample) {
  const std::vector<int64_t> short_step(8, 100), mixed = {100, 90, 300, 80, 70, 60, 50, 40};
  EXPECT_EQ(context_degree(short_step, 1, 4, 100), 1);       // pure data parallelism over 4 ranks
  EXPECT_EQ(context_degree(mixed, 1, 4, 100), 4);            // 300 tokens need 3 ranks: the divisor 4
  EXPECT_EQ(context_degree(mixed, 1, 4, 150), 2);            // 2 x 150
  EXPECT_EQ(context_degree(mixed, 1, 6, 100), 3);            // 3 divides 6
  EXPECT_EQ(context_degree(mixed, 1, 4, 74), 0);             // 4 x 74 < 300
  EXPECT_EQ(context_degree(mixed, 1, 4, 75), 4);             // exactly 4 x 75
  EXPECT_EQ(context_degree({100, 100}, 1, 4, 100), 2);       // 4 groups of one rank would leave two empty
  EXPECT_EQ(context_degree({100, 100, 100}, 2, 4, 100), 4);  // dp 2 x 4: at 2, four groups for 3 samples
  EXPECT_EQ(context_degree({100}, 2, 4, 100), 4);            // never above cp: the step's dealing refuses it
}

TEST(BalanceAcrossRanks, UnevenCountsAfterDrops) {
  const std::vector<SampleCost> costs = {{5, 0}, {9, 0}, {3, 0}, {7, 0}, {6, 0}};
  const auto split = balance_across_ranks(costs, 2);
  EXPECT_EQ(split[0].size(), 3u);  // the first n % ranks ranks take one more
  EXPECT_EQ(split[1].size(), 2u);
  EXPECT_THROW(balance_across_ranks({{5, 0}}, 2), DataError);
}

TEST(RankMicroBatches, EachRankTakesItsBalancedShare) {
  std::vector<TokenizedExample> step;
  for (int64_t tokens : {30, 8, 21, 12, 17, 25}) step.push_back(example(tokens, 2, 2));
  std::vector<std::string> seen;
  int64_t tokens_of[2] = {0, 0};
  for (int64_t rank : {0, 1}) {
    const auto batches = rank_micro_batches(step, {2, true, 0, rank, 2});
    ASSERT_EQ(batches.size(), 2u) << rank;  // 3 samples in micro-batches of 2: 2 + 1
    for (const Batch& b : batches) {
      seen.insert(seen.end(), b.answers.begin(), b.answers.end());
      tokens_of[rank] += b.input_ids.size(1);
    }
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<std::string>{"12", "17", "21", "25", "30", "8"}));
  // Every sample has 4 patches, so tokens decide (fair part 56.5). Largest first, each to the rank
  // that stays lighter: 30 -> r0 (tie), 25 -> r1, 21 -> r1 (51 vs 46), 17 -> r0 (47 vs 63),
  // 12 -> r1 (59 vs 58; r1 full after), 8 -> r0: 55 and 58 tokens, where a split in order gives
  // 59 and 54.
  EXPECT_EQ(tokens_of[0], 55);
  EXPECT_EQ(tokens_of[1], 58);
  EXPECT_THROW(rank_micro_batches(step, {2, true, 0, 2, 2}), DataError);
}

}  // namespace
}  // namespace loom::data
