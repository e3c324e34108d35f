// Deterministic randomness: splitmix64 against its published first outputs, the counter stream against
// values worked in Python, and the keyed permutation's bijectivity.
#include "loom/util/random.h"

#include <gtest/gtest.h>

#include <vector>

#include "loom/util/errors.h"

using namespace loom;

TEST(Random, Splitmix64MatchesTheReferenceSequenceFromZero) {
  // The reference generator seeded with 0 outputs e220a8397b1dcdaf, 6e789e6aa1b965f4, 06c45d188009454f.
  uint64_t state = 0;
  std::vector<uint64_t> outputs;
  for (int i = 0; i < 3; ++i) {
    outputs.push_back(splitmix64(state));
    state += kGoldenGamma;
  }
  EXPECT_EQ(outputs,
            (std::vector<uint64_t>{0xe220a8397b1dcdafULL, 0x6e789e6aa1b965f4ULL, 0x06c45d188009454fULL}));
  EXPECT_EQ(mix64(kGoldenGamma), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(mix64(0), 0u);  // the mixer alone has 0 as a fixed point
}

TEST(Random, CounterRngStartsAtTheHashOfSeedStreamAndIndex) {
  // Worked in Python: start = mix(mix(mix(7 + gamma) ^ 1) + 5), then the splitmix64 stream from it.
  EXPECT_EQ(counter_start(7, 1, 5), 0x21209a9d7a738d0eULL);
  CounterRng rng(7, 1, 5);
  EXPECT_EQ(rng.next(), 0xe3d6b4ca24fe9031ULL);
  EXPECT_EQ(rng.below(10), 0x3566c7f67ede1449ULL % 10);
  EXPECT_EQ(rng.between(3, 12), 3 + static_cast<int>(0x4847f406da7cd15dULL % 10));
  // Another index, stream or seed starts elsewhere; the same triple starts at the same place.
  EXPECT_NE(counter_start(7, 1, 6), counter_start(7, 1, 5));
  EXPECT_NE(counter_start(7, 0, 5), counter_start(7, 1, 5));
  EXPECT_NE(counter_start(8, 1, 5), counter_start(7, 1, 5));
  EXPECT_EQ(CounterRng(7, 1, 5).next(), CounterRng(7, 1, 5).next());
}

TEST(PermuteIndex, IsAPermutationThatDependsOnTheKey) {
  for (uint64_t n : {1, 2, 3, 5, 16, 17, 100, 1000, 4097}) {
    std::vector<int> hits(n, 0);
    for (uint64_t i = 0; i < n; ++i) ++hits[permute_index(i, n, 42)];
    for (uint64_t j = 0; j < n; ++j) ASSERT_EQ(hits[j], 1) << "n=" << n << " j=" << j;
  }
  int same_as_identity = 0, same_across_keys = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    same_as_identity += permute_index(i, 1000, 7) == i;
    same_across_keys += permute_index(i, 1000, 7) == permute_index(i, 1000, 8);
  }
  // A random permutation has one fixed point on average, and two independent ones agree on one.
  EXPECT_LT(same_as_identity, 10);
  EXPECT_LT(same_across_keys, 10);
  EXPECT_THROW(permute_index(5, 5, 0), DataError);
}
