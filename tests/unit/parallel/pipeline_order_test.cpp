#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "loom/parallel/pipeline/order.h"
#include "loom/util/errors.h"

namespace loom::parallel::pipeline {
namespace {

using Kind = Action::Kind;

// The compute actions of an order alone ("F0 F1 B0 ...", R for a recompute), as pipeline papers draw them.
std::string computes(const std::vector<Action>& order, const Shape& shape) {
  std::vector<Action> kept;
  for (const Action& a : order)
    if (a.kind == Kind::forward || a.kind == Kind::backward || a.kind == Kind::recompute) kept.push_back(a);
  return describe(kept, shape);
}

TEST(PipelineOrder, OneFOneBWithItsCommunicationAsWrittenByHand) {
  const Shape shape{2, 1, 3};
  EXPECT_EQ(describe(one_f_one_b_order(shape, 0), shape), "F0 sF0 F1 sF1 rB0 B0 F2 sF2 rB1 B1 rB2 B2");
  EXPECT_EQ(describe(one_f_one_b_order(shape, 1), shape), "rF0 F0 B0 sB0 rF1 F1 B1 sB1 rF2 F2 B2 sB2");
}

TEST(PipelineOrder, OneFOneBOnFourStagesAndEightMicroBatches) {
  // Narayanan et al. 2021, figure 4 (top): the warm-up shrinks by one per stage.
  const Shape shape{4, 1, 8};
  const char* expected[] = {
      "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7",
      "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7",
      "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7",
      "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7",
  };
  for (int64_t rank = 0; rank < 4; ++rank)
    EXPECT_EQ(computes(one_f_one_b_order(shape, rank), shape), expected[rank]) << "rank " << rank;
}

TEST(PipelineOrder, FewerMicroBatchesThanStagesOnlyWarmUpAndCoolDown) {
  const Shape shape{4, 1, 2};
  EXPECT_EQ(computes(one_f_one_b_order(shape, 0), shape), "F0 F1 B0 B1");
  EXPECT_EQ(computes(one_f_one_b_order(shape, 3), shape), "F0 B0 F1 B1");
}

TEST(PipelineOrder, GPipeRunsEveryForwardFirst) {
  const Shape shape{2, 1, 3};
  EXPECT_EQ(describe(gpipe_order(shape, 0), shape), "F0 sF0 F1 sF1 F2 sF2 rB0 B0 rB1 B1 rB2 B2");
  EXPECT_EQ(describe(gpipe_order(shape, 1), shape), "rF0 F0 rF1 F1 rF2 F2 B0 sB0 B1 sB1 B2 sB2");
}

TEST(PipelineOrder, InterleavedAsWrittenByHand) {
  // Two ranks, two chunks each (global stages 0 and 2 on rank 0, 1 and 3 on rank 1), four
  // micro-batches in groups of two: forwards (0,1) through chunk 0, (0,1) through chunk 1, then
  // (2,3) likewise; rank 0 warms up with (2-0-1)*2 + (2-1)*2 = 4 forwards, rank 1 with 2.
  const Shape shape{2, 2, 4};
  EXPECT_EQ(computes(one_f_one_b_order(shape, 0), shape),
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(computes(one_f_one_b_order(shape, 1), shape),
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  // Rank 1's chunk 1 is the last stage (no send after its forward, no receive before its
  // backward); its chunk 0 sends on to rank 0's chunk 1.
  EXPECT_EQ(
      describe(one_f_one_b_order(Shape{2, 2, 2}, 1), Shape{2, 2, 2}),
      "rF0.0 F0.0 sF0.0 rF1.0 F1.0 sF1.0 rF0.1 F0.1 B0.1 sB0.1 rF1.1 F1.1 B1.1 sB1.1 rB0.0 B0.0 sB0.0 rB1.0 "
      "B1.0 sB1.0");
}

TEST(PipelineOrder, RecomputeInTheBubblesRunsEachWarmUpForwardAgainBeforeItsGradientArrives) {
  // pp=3, 4 micro-batches: rank 0 warms up with F0 F1 (F2 is the forward the first backward follows):
  // F0 and F1 are run again just before their gradients are received; rank 1 warms up with F0 alone;
  // the last rank keeps everything (its backward follows its forward at once).
  const Shape shape{3, 1, 4};
  EXPECT_EQ(computes(recompute_in_bubbles(one_f_one_b_order(shape, 0), shape, 0), shape),
            "F0 F1 F2 R0 B0 F3 R1 B1 B2 B3");
  EXPECT_EQ(describe(recompute_in_bubbles(one_f_one_b_order(shape, 1), shape, 1), shape),
            "rF0 F0 sF0 rF1 F1 sF1 R0 rB0 B0 sB0 rF2 F2 sF2 rB1 B1 sB1 rF3 F3 sF3 rB2 B2 sB2 rB3 B3 sB3");
  EXPECT_EQ(recompute_in_bubbles(one_f_one_b_order(shape, 2), shape, 2), one_f_one_b_order(shape, 2));
}

// Runs every rank's order at once, sends never blocking and receives waiting for their message,
// and checks that the pipeline finishes (no deadlock), that each (micro-batch, global stage) runs its
// forward and then its backward exactly once on the rank that holds it, and that every message sent
// is received by the action that expects it. Returns each rank's most micro-batch chunks whose
// activations were held at once (forward done, backward not).
std::vector<int64_t> simulate(const Shape& shape, std::vector<Action> (*make)(const Shape&, int64_t),
                              bool recompute = false) {
  const int64_t p = shape.stages, last = shape.global_stages() - 1;
  std::vector<std::vector<Action>> orders;
  for (int64_t r = 0; r < p; ++r)
    orders.push_back(recompute ? recompute_in_bubbles(make(shape, r), shape, r) : make(shape, r));
  std::vector<size_t> next(p, 0);
  std::vector<int64_t> held(p, 0), peak(p, 0);
  std::set<std::tuple<int, int64_t, int64_t>> sent;  // (backward?, micro-batch, receiving global stage)
  std::set<std::pair<int64_t, int64_t>> forwarded, backwarded, recomputed;
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t r = 0; r < p; ++r) {
      while (next[r] < orders[r].size()) {
        const Action& a = orders[r][next[r]];
        const int64_t stage = global_stage(shape, r, a.chunk);
        if (a.kind == Kind::receive_forward || a.kind == Kind::receive_backward) {
          const auto key = std::make_tuple(a.kind == Kind::receive_backward, a.micro_batch, stage);
          if (!sent.count(key)) break;  // waits
          sent.erase(key);
        } else if (a.kind == Kind::send_forward) {
          EXPECT_LT(stage, last);
          sent.emplace(0, a.micro_batch, stage + 1);
        } else if (a.kind == Kind::send_backward) {
          EXPECT_GT(stage, 0);
          sent.emplace(1, a.micro_batch, stage - 1);
        } else if (a.kind == Kind::recompute) {
          EXPECT_TRUE(forwarded.count({a.micro_batch, stage})) << "recompute before forward";
          EXPECT_FALSE(backwarded.count({a.micro_batch, stage})) << "recompute after backward";
          EXPECT_TRUE(recomputed.emplace(a.micro_batch, stage).second);
        } else if (a.kind == Kind::forward) {
          EXPECT_TRUE(forwarded.emplace(a.micro_batch, stage).second);
          peak[r] = std::max(peak[r], ++held[r]);
        } else {
          EXPECT_TRUE(forwarded.count({a.micro_batch, stage})) << "backward before forward";
          EXPECT_TRUE(backwarded.emplace(a.micro_batch, stage).second);
          --held[r];
        }
        ++next[r];
        progress = true;
      }
    }
  }
  for (int64_t r = 0; r < p; ++r)
    EXPECT_EQ(next[r], orders[r].size())
        << "rank " << r << " waits forever at action " << next[r] << " of " << describe(orders[r], shape);
  EXPECT_TRUE(sent.empty()) << "a message nobody received";
  EXPECT_EQ(static_cast<int64_t>(forwarded.size()), shape.micro_batches * shape.global_stages());
  EXPECT_EQ(static_cast<int64_t>(backwarded.size()), shape.micro_batches * shape.global_stages());
  return peak;
}

TEST(PipelineOrder, EveryScheduleRunsToTheEndOnEveryShape) {
  for (int64_t p = 1; p <= 5; ++p)
    for (int64_t v = 1; v <= 3; ++v)
      for (int64_t m = 1; m <= 11; ++m) {
        const Shape shape{p, v, m};
        SCOPED_TRACE(::testing::Message()
                     << "pp " << p << ", virtual stages " << v << ", micro-batches " << m);
        const auto gpipe = simulate(shape, gpipe_order);
        if (v > 1 && m % p != 0) {  // the interleaved order takes whole groups of pp micro-batches
          EXPECT_THROW(one_f_one_b_order(shape, 0), ConfigError);
          continue;
        }
        const auto one_f_one_b = simulate(shape, one_f_one_b_order);
        simulate(shape, one_f_one_b_order, /*recompute=*/true);
        simulate(shape, gpipe_order, /*recompute=*/true);
        for (int64_t r = 0; r < p; ++r) {
          EXPECT_EQ(gpipe[r], m * v);  // GPipe holds every micro-batch
          if (v == 1)
            EXPECT_EQ(one_f_one_b[r], std::min(m, p - r));  // 1F1B at most pp - rank
          else
            EXPECT_LE(one_f_one_b[r], std::min(m * v, (p - r - 1) * 2 + (v - 1) * p + 1));
        }
      }
}

}  // namespace
}  // namespace loom::parallel::pipeline
