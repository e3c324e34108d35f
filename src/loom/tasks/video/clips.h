// The captioned clips a video task (vae, flow_matching) trains and evaluates on: the built-in
// moving_fashion set, its training split walked epoch by epoch in a fresh seeded order, and the words
// of its captions as a tokenizer.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/config/config.h"
#include "loom/data/synth/moving_fashion.h"
#include "loom/data/tokenizer/word_tokenizer.h"

namespace loom::tasks {

class VideoClips {
 public:
  // ConfigError naming the key for a dataset that has no clips.
  VideoClips(const config::DataSection& data, uint64_t seed);

  int64_t frames() const { return frames_; }
  int64_t height() const { return size_; }
  int64_t width() const { return size_; }

  // Training clip `index` of the run: the split's clips in a seeded order that changes every epoch.
  data::VideoClip train(int64_t index) const;
  int64_t eval_size() const;
  data::VideoClip eval(int64_t index) const;  // 0 <= index < eval_size()

  // Every word of every caption (the built-in text encoder's vocabulary).
  const data::WordTokenizer& tokenizer() const { return tokenizer_; }

 private:
  std::shared_ptr<const data::MovingFashion> set_;
  uint64_t seed_;
  int64_t frames_, size_;
  data::WordTokenizer tokenizer_;
};

// The words of moving_fashion's captions ("a", "moving", the class names' words, the directions) as a
// word tokenizer: the built-in text encoder's vocabulary.
data::WordTokenizer moving_fashion_tokenizer();

// A clip's frames as the video models take them: [3, T, H, W] float32 in [-1, 1].
at::Tensor video_tensor(const data::VideoClip& clip);
// The reverse, rounding down as Wan's pipeline does ((x + 1) / 2 x 255, clamped, truncated):
// video [3, T, H, W] in [-1, 1] -> (T, H, W, 3) bytes.
std::vector<uint8_t> video_bytes(const at::Tensor& video);

}  // namespace loom::tasks
