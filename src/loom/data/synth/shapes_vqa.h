// Shapes VQA: a built-in synthetic visual question answering set over images of coloured shapes,
// generated deterministically from (seed, split, index) so any sample can be rebuilt anywhere.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "loom/data/vqa.h"

namespace loom::data {

// The image is a 2x2 grid of quadrants (each image_size/2 square, one merged vision token at
// 56px); each quadrant is empty or holds one shape. Train and eval never share a scene: the
// scene's content (shape and colour per quadrant) decides its split, independent of the seed.
class ShapesVqa {
 public:
  ShapesVqa(uint64_t seed, int64_t image_size);  // image_size: positive multiple of 28

  VqaSample sample(Split split, int64_t index) const;  // index >= 0

  int64_t image_size() const { return image_size_; }

  // The held-out split is generated without end; an evaluation asks at most this many questions.
  static constexpr int64_t kMaxEvalSamples = 100000;

  static const std::vector<std::string>& question_types();  // {"color","shape","count","position"}
  static std::vector<std::string> vocabulary();             // every word of any question or answer

 private:
  uint64_t seed_;
  int64_t image_size_;
};

}  // namespace loom::data
