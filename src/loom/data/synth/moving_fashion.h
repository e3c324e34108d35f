// Moving Fashion-MNIST: Loom's built-in video set that needs nothing but Debian's Fashion-MNIST
// package. One 28x28 item moves in a straight line across a larger black canvas, left, right, up or
// down, captioned "a sneaker moving left"; every clip follows from (seed, split, index).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/data/fashion_vqa.h"
#include "loom/data/vqa.h"

namespace loom::data {

// A clip: frames (T, H, W, 3) 8-bit RGB (grey in all three channels), its caption, and what the
// caption says (for judging generated clips).
struct VideoClip {
  int64_t frames = 0, height = 0, width = 0;
  std::vector<uint8_t> rgb;  // (frames, height, width, 3)
  std::string caption;
  int label = 0;      // Fashion-MNIST class, 0..9
  int direction = 0;  // index into MovingFashion::directions()
};

class MovingFashion {
 public:
  // The item crosses the canvas from one edge to the other over the clip: canvas >= 28 + 2 x
  // frames - 2 pixels moves it at least two pixels a frame. frames >= 2.
  MovingFashion(std::shared_ptr<const FashionMnist> train, std::shared_ptr<const FashionMnist> eval,
                uint64_t seed, int64_t canvas, int64_t frames);
  // Loads both splits from `dir` (see FashionMnist).
  MovingFashion(const std::string& dir, uint64_t seed, int64_t canvas, int64_t frames);

  // train: every training item in each of the four directions (240,000 clips); eval: the t10k items,
  // each in the direction its index picks (10,000 clips), so held-out captions show unseen items.
  int64_t size(Split split) const;
  // DataError unless 0 <= index < size(split). Safe to call from several threads at once.
  VideoClip sample(Split split, int64_t index) const;

  int64_t canvas() const { return canvas_; }
  int64_t frames() const { return frames_; }

  static const std::vector<std::string>& directions();  // "left", "right", "up", "down"
  // "a <class name> moving <direction>", the class names of FashionVqa::class_names().
  static std::string caption(int label, int direction);

 private:
  std::shared_ptr<const FashionMnist> train_, eval_;
  uint64_t seed_;
  int64_t canvas_, frames_;
};

}  // namespace loom::data
