// Moving Fashion-MNIST against its definition, from Debian's Fashion-MNIST files: every frame holds
// exactly the item's 28x28 pixels at the offset the closed form gives (edge to edge along the
// motion, the crossing line fixed), black elsewhere; captions name the item's class and direction;
// the training split covers each item in each direction; everything follows from (seed, split, index).
#include "loom/data/synth/moving_fashion.h"

#include <gtest/gtest.h>

#include <memory>

#include "loom/util/errors.h"

namespace loom::data {
namespace {

struct Items {
  std::shared_ptr<FashionMnist> train = std::make_shared<FashionMnist>(FashionMnist::kDefaultDir, "train");
  std::shared_ptr<FashionMnist> eval = std::make_shared<FashionMnist>(FashionMnist::kDefaultDir, "t10k");
};

const Items& items() {
  static const Items loaded;
  return loaded;
}

// Where the item's top-left corner is in frame t: (x, y).
std::pair<int64_t, int64_t> corner(int direction, int64_t t, int64_t frames, int64_t travel, int64_t across) {
  const int64_t along = (travel * t + (frames - 1) / 2) / (frames - 1);
  switch (direction) {
    case 0:
      return {travel - along, across};
    case 1:
      return {along, across};
    case 2:
      return {across, travel - along};
    default:
      return {across, along};
  }
}

TEST(MovingFashion, EveryFrameIsTheItemAtItsClosedFormOffset) {
  const int64_t canvas = 48, frames = 9, travel = canvas - 28;
  const MovingFashion set(items().train, items().eval, 7, canvas, frames);
  EXPECT_EQ(set.size(Split::train), 4 * 60000);
  EXPECT_EQ(set.size(Split::eval), 10000);
  for (int64_t index : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4097}, int64_t{239999}}) {
    const VideoClip clip = set.sample(Split::train, index);
    const int64_t item = index / 4;
    EXPECT_EQ(clip.direction, index % 4);
    EXPECT_EQ(clip.label, items().train->label(item));
    EXPECT_EQ(clip.caption, MovingFashion::caption(clip.label, clip.direction));
    ASSERT_EQ(clip.rgb.size(), static_cast<size_t>(frames * canvas * canvas * 3));
    // The crossing line: the first frame's offset across the motion, read off the pixels.
    int64_t across = -1;
    for (int64_t a = 0; a <= travel && across < 0; ++a) {
      const auto [x, y] = corner(clip.direction, 0, frames, travel, a);
      bool same = true;
      for (int64_t r = 0; r < 28 && same; ++r)
        for (int64_t c = 0; c < 28 && same; ++c)
          same = clip.rgb[static_cast<size_t>(((y + r) * canvas + x + c) * 3)] ==
                 items().train->pixels(item)[r * 28 + c];
      if (same) across = a;
    }
    ASSERT_GE(across, 0) << "the item is not where any crossing line puts it";
    for (int64_t t = 0; t < frames; ++t) {
      const auto [x, y] = corner(clip.direction, t, frames, travel, across);
      int64_t lit_outside = 0;
      for (int64_t row = 0; row < canvas; ++row)
        for (int64_t col = 0; col < canvas; ++col) {
          const uint8_t* p = clip.rgb.data() + ((t * canvas + row) * canvas + col) * 3;
          EXPECT_TRUE(p[0] == p[1] && p[1] == p[2]);
          const bool inside = row >= y && row < y + 28 && col >= x && col < x + 28;
          if (inside)
            ASSERT_EQ(p[0], items().train->pixels(item)[(row - y) * 28 + col - x]) << "frame " << t;
          else
            lit_outside += p[0] != 0;
        }
      EXPECT_EQ(lit_outside, 0) << "frame " << t;
    }
    // Edge to edge: the first and last frames touch opposite sides.
    const auto [x0, y0] = corner(clip.direction, 0, frames, travel, across);
    const auto [x1, y1] = corner(clip.direction, frames - 1, frames, travel, across);
    EXPECT_EQ(std::abs(x1 - x0) + std::abs(y1 - y0), travel);
  }
}

TEST(MovingFashion, SplitsFollowFromSeedAndIndexAlone) {
  const MovingFashion a(items().train, items().eval, 7, 48, 9), b(items().train, items().eval, 7, 48, 9);
  const MovingFashion other(items().train, items().eval, 8, 48, 9);
  int differs = 0, directions[4] = {0, 0, 0, 0};
  for (int64_t i = 0; i < 200; ++i) {
    const VideoClip x = a.sample(Split::eval, i), y = b.sample(Split::eval, i);
    EXPECT_EQ(x.rgb, y.rgb);
    EXPECT_EQ(x.label, items().eval->label(i));
    differs += x.rgb != other.sample(Split::eval, i).rgb;
    ++directions[x.direction];
  }
  EXPECT_GT(differs, 150);  // another seed: other lines and directions
  for (int d : directions) EXPECT_GT(d, 20);
  EXPECT_EQ(MovingFashion::caption(9, 0), "a ankle boot moving left");
  EXPECT_EQ(MovingFashion::caption(7, 3), "a sneaker moving down");
}

TEST(MovingFashion, ErrorsNameWhatIsWrong) {
  EXPECT_THROW(MovingFashion(items().train, items().eval, 1, 40, 9), ConfigError);  // 28 + 2 x 8 > 40
  EXPECT_THROW(MovingFashion(items().train, items().eval, 1, 48, 1), ConfigError);
  const MovingFashion set(items().train, items().eval, 1, 48, 9);
  EXPECT_THROW(set.sample(Split::eval, 10000), DataError);
  EXPECT_THROW(set.sample(Split::train, -1), DataError);
}

}  // namespace
}  // namespace loom::data
