// M-RoPE position ids and Qwen2.5-VL window indexes against hand-worked cases.
#include <gtest/gtest.h>

#include "loom/models/qwen2_vl/model.h"
#include "loom/models/qwen2_vl/vision.h"
#include "loom/util/errors.h"

namespace loom::models {
namespace {

Qwen2VLConfig tiny_config() {
  Qwen2VLConfig c;
  c.tokens.image = 252;
  c.tokens.video = 253;
  c.tokens.vision_start = 250;
  c.tokens.vision_end = 251;
  return c;
}

TEST(RopeIndex, TwoSamplesWithPaddingWorkedByHand) {
  // Sample 0: 2 text, vision_start, 4 image tokens (grid 1x4x4 -> 2x2 merged), vision_end, 2 text.
  // Sample 1: text, vision_start, 6 image tokens (grid 1x4x6 -> 2x3 merged), vision_end, one pad.
  auto ids = at::tensor({1, 2,   250, 252, 252, 252, 252, 251, 3,   4,  //
                         1, 250, 252, 252, 252, 252, 252, 252, 251, 0},
                        at::kLong)
                 .view({2, 10});
  auto mask = at::ones({2, 10}, at::kLong);
  mask[1][9] = 0;
  auto grid = at::tensor({1, 4, 4, 1, 4, 6}, at::kLong).view({2, 3});
  auto r = rope_index(ids, grid, mask, tiny_config());
  const std::vector<int64_t> t0{0, 1, 2, 3, 3, 3, 3, 5, 6, 7}, h0{0, 1, 2, 3, 3, 4, 4, 5, 6, 7},
      w0{0, 1, 2, 3, 4, 3, 4, 5, 6, 7};
  const std::vector<int64_t> t1{0, 1, 2, 2, 2, 2, 2, 2, 5, 1}, h1{0, 1, 2, 2, 2, 3, 3, 3, 5, 1},
      w1{0, 1, 2, 3, 4, 2, 3, 4, 5, 1};
  auto expect_row = [&](int axis, int b, const std::vector<int64_t>& v) {
    EXPECT_TRUE(at::equal(r.position_ids[axis][b], at::tensor(v, at::kLong)))
        << "axis " << axis << " sample " << b;
  };
  expect_row(0, 0, t0);
  expect_row(1, 0, h0);
  expect_row(2, 0, w0);
  expect_row(0, 1, t1);
  expect_row(1, 1, h1);
  expect_row(2, 1, w1);
  EXPECT_EQ(r.rope_deltas[0][0].item<int64_t>(), 8 - 10);
  EXPECT_EQ(r.rope_deltas[1][0].item<int64_t>(), 6 - 10);
}

TEST(RopeIndex, PackedRowStartsEverySampleAfresh) {
  // The two samples above back to back in one row (no padding): each keeps its own positions.
  auto ids = at::tensor({1, 2, 250, 252, 252, 252, 252, 251, 3, 4,  //
                         1, 250, 252, 252, 252, 252, 252, 252, 251},
                        at::kLong)
                 .view({1, 19});
  auto grid = at::tensor({1, 4, 4, 1, 4, 6}, at::kLong).view({2, 3});
  auto r = rope_index(ids, grid, at::Tensor(), tiny_config(), {0, 10, 19});
  const std::vector<int64_t> t{0, 1, 2, 3, 3, 3, 3, 5, 6, 7, 0, 1, 2, 2, 2, 2, 2, 2, 5},
      h{0, 1, 2, 3, 3, 4, 4, 5, 6, 7, 0, 1, 2, 2, 2, 3, 3, 3, 5},
      w{0, 1, 2, 3, 4, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 2, 3, 4, 5};
  EXPECT_TRUE(at::equal(r.position_ids[0][0], at::tensor(t, at::kLong)));
  EXPECT_TRUE(at::equal(r.position_ids[1][0], at::tensor(h, at::kLong)));
  EXPECT_TRUE(at::equal(r.position_ids[2][0], at::tensor(w, at::kLong)));
  EXPECT_EQ(r.rope_deltas[0][0].item<int64_t>(), 6 - 9);  // the last sample's

  // An image cut by a sample boundary, and boundaries that do not cover the row, are errors.
  EXPECT_THROW(rope_index(ids, grid, at::Tensor(), tiny_config(), {0, 5, 19}), ModelError);
  EXPECT_THROW(rope_index(ids, grid, at::Tensor(), tiny_config(), {0, 10}), ModelError);
}

TEST(RopeIndex, MismatchedImageTokensAreErrors) {
  auto ids = at::tensor({250, 252, 252, 251}, at::kLong).view({1, 4});
  auto grid = at::tensor({1, 4, 4}, at::kLong).view({1, 3});  // needs 4 image tokens
  EXPECT_THROW(rope_index(ids, grid, at::Tensor(), tiny_config()), ModelError);
}

TEST(WindowIndex, WorkedByHandAndInverse) {
  VisionConfig c;
  c.family = VisionFamily::qwen2_5_vl;
  c.window_size = 56;  // 56 / merge 2 / patch 14 = windows of 2x2 merge units
  // Image 0: grid 1x4x6 -> units 2x3: window (0,0) holds units 0,1,3,4; window (0,1) holds 2,5.
  // Image 1: grid 1x2x2 -> one unit (6).
  auto grid = at::tensor({1, 4, 6, 1, 2, 2}, at::kLong).view({2, 3});
  auto w = vision_window_index(grid, c);
  EXPECT_TRUE(at::equal(w.unit_order, at::tensor({0, 1, 3, 4, 2, 5, 6}, at::kLong)));
  EXPECT_EQ(w.cu_window_seqlens, (std::vector<int64_t>{0, 16, 24, 28}));
  auto inverse = at::argsort(w.unit_order);
  EXPECT_TRUE(at::equal(w.unit_order.index_select(0, inverse), at::arange(7, at::kLong)));
  EXPECT_TRUE(at::equal(inverse, at::tensor({0, 1, 4, 2, 3, 5, 6}, at::kLong)));
}

TEST(WindowIndex, FrameSegments) {
  auto grid = at::tensor({2, 4, 6, 1, 2, 2}, at::kLong).view({2, 3});
  EXPECT_EQ(vision_frame_cu_seqlens(grid), (std::vector<int64_t>{0, 24, 48, 52}));
}

}  // namespace
}  // namespace loom::models
