// The captioned clips a video task (vae, flow_matching) trains and evaluates on: the built-in
// moving_fashion set, or the user's videos and images (dataset: videos) decoded through FFmpeg's
// libraries, sampled at data.fps, resized and centre-cropped to data.video_size. Training samples are
// addressed by their index in the run's stream (epochs in a fresh seeded order; the user's files
// mixed by weight), so a resumed run sees the same samples.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loom/config/config.h"
#include "loom/core/layout.h"
#include "loom/data/conversation.h"
#include "loom/data/mix.h"
#include "loom/data/synth/moving_fashion.h"
#include "loom/data/tokenizer/word_tokenizer.h"
#include "loom/data/video/captioned_media.h"

namespace loom::tasks {

class VideoClips {
 public:
  // Reads the user's dataset files now: bad training samples are skipped and counted; a held-out one
  // among the first data.eval_samples that cannot be used (malformed, missing, not decoding, too
  // short) is a DataError naming its file and index, found before any training. ConfigError naming
  // the key for a dataset that has no clips.
  VideoClips(const config::DataSection& data, uint64_t seed);

  int64_t frames() const { return frames_; }  // a video sample's; an image sample is one frame
  int64_t height() const { return size_; }
  int64_t width() const { return size_; }

  // Training sample `index` of the run, or nullopt when it is unusable (a missing, corrupt or too
  // short file: counted in skips(), named in a warning the first times). Safe from several threads.
  std::optional<data::VideoClip> train(int64_t index) const;
  // Samples in one epoch of the training stream.
  int64_t train_size() const;
  // Its frame count (frames(), or 1 for an image), without decoding it.
  int64_t train_frames(int64_t index) const;
  int64_t eval_size() const;  // every held-out sample (the user's files may have none)
  // The first eval_samples() of them are the evaluation's: data.eval_samples, or all when they are fewer.
  int64_t eval_samples() const { return eval_samples_; }
  data::VideoClip eval(int64_t index) const;  // 0 <= index < eval_size(); DataError naming the file
  int64_t eval_frames(int64_t index) const;
  std::string eval_caption(int64_t index) const;
  data::SkipCounts skips() const { return skips_->counts(); }

  // The built-in set's caption words as a tokenizer (the built-in text encoder's vocabulary), or
  // null for the user's files, whose captions need a text encoder with its own tokenizer.
  std::shared_ptr<const data::Tokenizer> builtin_tokenizer() const { return tokenizer_; }

 private:
  data::VideoClip load(const data::CaptionedMedia& media) const;  // DataError naming the file

  std::shared_ptr<const data::MovingFashion> set_;
  std::vector<std::vector<data::CaptionedMedia>> files_;
  std::unique_ptr<data::MixLayout> mix_;
  std::vector<data::CaptionedMedia> eval_files_;
  uint64_t seed_;
  int64_t frames_, size_;
  double fps_;
  int64_t eval_samples_ = 0;
  std::shared_ptr<data::WordTokenizer> tokenizer_;
  std::shared_ptr<data::SkipLog> skips_;
};

// Samples [begin, end) as batches of at most `size` that share a frame count (`frames_of(i)`): a batch
// is one tensor, so images (one frame) and videos go in separate ones. The samples of each frame
// count in order, cut into batches, the counts in the order they first appear.
std::vector<std::vector<int64_t>> same_shape_batches(int64_t begin, int64_t end, int64_t size,
                                                     const std::function<int64_t(int64_t)>& frames_of);

// The words of moving_fashion's captions ("a", "moving", the class names' words, the directions) as a
// word tokenizer: the built-in text encoder's vocabulary.
data::WordTokenizer moving_fashion_tokenizer();

// A clip's frames as the video models take them: [3, T, H, W] float32 in [-1, 1].
at::Tensor video_tensor(const data::VideoClip& clip);
// The reverse, rounding down as the reference text-to-video pipeline does ((x + 1) / 2 x 255, clamped,
// truncated): video [3, T, H, W] in [-1, 1] -> (T, H, W, 3) bytes.
std::vector<uint8_t> video_bytes(const at::Tensor& video);

// Writes video [3, T, H, W] in [-1, 1] as <dir>/<name>.gif, <dir>/<name>.mp4 and
// <dir>/<name>/frame-NNNN.png at `fps`.
void write_clip(const at::Tensor& video, const std::string& dir, const std::string& name, double fps);

// An evaluation's clips (sampled or reconstructed): clip i of `count`, named sample-NNN, is made by
// make(i) on data-parallel rank i mod ranks (every rank of its tensor-parallel group makes it, for the
// model's collectives; the group's first writes it with write_clip), and the main rank writes
// captions.json: describe(i) of every clip with its "name". Returns the folder,
// <output_dir>/samples/step-NNNNNNNN, or <output_dir>/samples/eval for step -1 (outside training).
std::string write_eval_clips(const std::string& output_dir, int64_t step, int64_t count,
                             const core::Layout& layout,
                             const std::function<nlohmann::json(int64_t)>& describe,
                             const std::function<at::Tensor(int64_t)>& make, double fps);

}  // namespace loom::tasks
