// Choosing the next token: greedy is the argmax; sampling draws each token with its probability
// after the temperature, top-k and top-p cuts (frequencies over many keyed draws against the closed
// form); right-padded prompts move to the left; bad sampling options are named.
#include "loom/tasks/vlm_sft/generate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "loom/util/errors.h"

namespace loom::tasks {
namespace {

// Logits of probabilities 0.5, 0.3, 0.15, 0.05 (in a scrambled order) for one row.
at::Tensor logits() {
  return at::tensor({std::log(0.15), std::log(0.5), std::log(0.05), std::log(0.3)}, at::kDouble)
      .to(at::kFloat)
      .view({1, 4});
}

std::map<int64_t, double> frequencies(const SamplingOptions& options, int draws) {
  std::map<int64_t, double> out;
  for (int step = 0; step < draws; ++step) out[pick_tokens(logits(), options, step)[0]] += 1.0 / draws;
  return out;
}

TEST(Generate, GreedyIsTheArgmaxOfEachRow) {
  const at::Tensor two = at::cat({logits(), logits().flip(1)});
  EXPECT_EQ(pick_tokens(two, {}, 0), (std::vector<int64_t>{1, 2}));
}

TEST(Generate, SamplingFollowsTheCutDistribution) {
  constexpr int kDraws = 20000;
  SamplingOptions options;
  options.temperature = 1.0;
  options.seed = 7;
  auto f = frequencies(options, kDraws);
  EXPECT_NEAR(f[1], 0.5, 0.015);
  EXPECT_NEAR(f[3], 0.3, 0.015);
  EXPECT_NEAR(f[0], 0.15, 0.015);
  EXPECT_NEAR(f[2], 0.05, 0.01);
  options.top_k = 2;  // 0.5 and 0.3, renormalised
  f = frequencies(options, kDraws);
  EXPECT_EQ(f.size(), 2u);
  EXPECT_NEAR(f[1], 0.625, 0.015);
  options.top_k = 0;
  options.top_p = 0.9;  // 0.5 + 0.3 < 0.9: 0.15 joins them
  f = frequencies(options, kDraws);
  EXPECT_EQ(f.size(), 3u);
  EXPECT_NEAR(f[0], 0.15 / 0.95, 0.015);
  options.top_p = 0.5;  // the most likely alone reaches it
  EXPECT_EQ(frequencies(options, 200).size(), 1u);
  // Temperature 0.5 squares the probabilities before renormalising.
  options.top_p = 1.0;
  options.temperature = 0.5;
  f = frequencies(options, kDraws);
  EXPECT_NEAR(f[1], 0.25 / (0.25 + 0.09 + 0.0225 + 0.0025), 0.015);
  // The same (seed, row, step) draws the same token: a prompt draws alike in any batch, given its
  // index among all prompts.
  EXPECT_EQ(pick_tokens(logits(), options, 123), pick_tokens(logits(), options, 123));
  const at::Tensor batch = at::cat({logits(), logits(), logits()});
  for (int64_t step = 0; step < 50; ++step) {
    SamplingOptions alone = options;
    const std::vector<int64_t> together = pick_tokens(batch, options, step);
    for (int64_t r = 0; r < 3; ++r) {
      alone.first_row = static_cast<uint64_t>(r);
      EXPECT_EQ(pick_tokens(logits(), alone, step)[0], together[static_cast<size_t>(r)]) << step << " " << r;
    }
  }
}

TEST(Generate, RightPaddedRowsMoveLeft) {
  data::Batch batch;
  batch.input_ids = at::tensor({1, 2, 3, 4, 5, 0}, at::kLong).view({2, 3});
  batch.attention_mask = at::tensor({1, 1, 1, 1, 1, 0}, at::kLong).view({2, 3});
  const auto in = left_padded(batch, 9);
  EXPECT_TRUE(in.input_ids.equal(at::tensor({1, 2, 3, 9, 4, 5}, at::kLong).view({2, 3})));
  EXPECT_TRUE(in.attention_mask.equal(at::tensor({1, 1, 1, 0, 1, 1}, at::kLong).view({2, 3})));
}

TEST(Generate, BadSamplingOptionsAreNamed) {
  const auto message = [](SamplingOptions options) {
    try {
      check_sampling(options);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  SamplingOptions o;
  o.top_p = 0;
  EXPECT_NE(message(o).find("--top-p"), std::string::npos);
  o = {};
  o.temperature = -1;
  EXPECT_NE(message(o).find("--temperature"), std::string::npos);
  o = {};
  o.max_new_tokens = 0;
  EXPECT_NE(message(o).find("--max-new-tokens"), std::string::npos);
  EXPECT_EQ(message({}), "");
}

}  // namespace
}  // namespace loom::tasks
