#include "loom/data/synth/moving_fashion.h"

#include <fmt/format.h>

#include <algorithm>

#include "loom/util/errors.h"
#include "loom/util/random.h"

namespace loom::data {

namespace {

constexpr uint64_t kPlacementStream = 11;  // where an item crosses, and an eval clip's direction
constexpr int kDirections = 4;

}  // namespace

MovingFashion::MovingFashion(std::shared_ptr<const FashionMnist> train,
                             std::shared_ptr<const FashionMnist> eval, uint64_t seed, int64_t canvas,
                             int64_t frames)
    : train_(std::move(train)), eval_(std::move(eval)), seed_(seed), canvas_(canvas), frames_(frames) {
  if (frames < 2)
    throw ConfigError(fmt::format("moving_fashion: a clip needs at least 2 frames, got {}", frames));
  const int64_t least = FashionMnist::kSide + 2 * (frames - 1);
  if (canvas < least)
    throw ConfigError(fmt::format(
        "moving_fashion: a canvas of {} pixels is too small for {} frames: the item (28 pixels) must move at "
        "least 2 pixels a frame, so the canvas needs at least {}",
        canvas, frames, least));
}

MovingFashion::MovingFashion(const std::string& dir, uint64_t seed, int64_t canvas, int64_t frames)
    : MovingFashion(std::make_shared<FashionMnist>(dir, "train"), std::make_shared<FashionMnist>(dir, "t10k"),
                    seed, canvas, frames) {}

int64_t MovingFashion::size(Split split) const {
  return split == Split::train ? train_->size() * kDirections : eval_->size();
}

const std::vector<std::string>& MovingFashion::directions() {
  static const std::vector<std::string> names = {"left", "right", "up", "down"};
  return names;
}

std::string MovingFashion::caption(int label, int direction) {
  return fmt::format("a {} moving {}", FashionVqa::class_names().at(static_cast<size_t>(label)),
                     directions().at(static_cast<size_t>(direction)));
}

VideoClip MovingFashion::sample(Split split, int64_t index) const {
  if (index < 0 || index >= size(split))
    throw DataError(fmt::format("moving_fashion: clip {} is outside the {} clips of the {} split", index,
                                size(split), split == Split::train ? "training" : "held-out"));
  const FashionMnist& items = split == Split::train ? *train_ : *eval_;
  CounterRng rng(seed_, kPlacementStream + (split == Split::train ? 0 : 1), static_cast<uint64_t>(index));
  const int64_t item = split == Split::train ? index / kDirections : index;
  const int direction =
      split == Split::train ? static_cast<int>(index % kDirections) : rng.below(kDirections);
  const int64_t side = FashionMnist::kSide, travel = canvas_ - side;
  // The crossing line, anywhere the item fits whole.
  const int64_t across = rng.between(0, static_cast<int>(travel));
  VideoClip clip;
  clip.frames = frames_;
  clip.height = clip.width = canvas_;
  clip.label = items.label(item);
  clip.direction = direction;
  clip.caption = caption(clip.label, direction);
  clip.rgb.assign(static_cast<size_t>(frames_ * canvas_ * canvas_ * 3), 0);
  const uint8_t* pixels = items.pixels(item);
  for (int64_t t = 0; t < frames_; ++t) {
    // Edge to edge: the offset along the motion goes 0 -> travel (rounded to whole pixels).
    const int64_t along = (travel * t + (frames_ - 1) / 2) / (frames_ - 1);
    int64_t x = 0, y = 0;
    switch (direction) {
      case 0:
        x = travel - along, y = across;
        break;  // left
      case 1:
        x = along, y = across;
        break;  // right
      case 2:
        x = across, y = travel - along;
        break;  // up
      default:
        x = across, y = along;
        break;  // down
    }
    uint8_t* frame = clip.rgb.data() + t * canvas_ * canvas_ * 3;
    for (int64_t r = 0; r < side; ++r)
      for (int64_t c = 0; c < side; ++c) {
        uint8_t* out = frame + ((y + r) * canvas_ + (x + c)) * 3;
        out[0] = out[1] = out[2] = pixels[r * side + c];
      }
  }
  return clip;
}

}  // namespace loom::data
