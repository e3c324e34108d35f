// Pre-extracted flow-matching features, as MindSpeed MM trains its video DiTs: each training sample's
// normalised VAE latents and its caption's text-encoder features, computed once by
// `loom data extract-features` into data.features and read back by a flow_matching job that names
// them, so training does not run the frozen VAE and text encoder on every step.
//
// A features directory holds safetensors shards of at most kShardSamples samples of one latent
// shape, each with `latents` [n, z, T', h, w] float32, `text` [sum of L_i, text_dim] float32 (each
// caption's own rows, as the text encoder gives them), `text_offsets` [n + 1] int64 (sample i's
// rows are text[offsets[i], offsets[i + 1])) and `source_index` [n] int64 (the sample's place in the
// stream it was taken from); train-NNNNN.safetensors for the training samples and eval-NNNNN for the
// held-out ones; and features.json, written last (a directory without it is incomplete), naming the
// shards, the held-out captions, the clips' size and frames, the VAE's latent statistics and the
// text encoder's features of the empty caption (which identify it).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/checkpoint/safetensors.h"
#include "loom/config/config.h"
#include "loom/models/generator.h"
#include "loom/tasks/flow_matching/text_encoder.h"

namespace loom::tasks::flow_matching {

constexpr int64_t kShardSamples = 1024;

// Writes the features of the first `samples` training samples of the job's stream (0: as many as its
// steps take, at most one epoch; unusable ones skipped and counted) and of its held-out samples
// (VideoClips::eval_samples) into `out_dir` (empty: data.features), which must not exist or be empty.
// ConfigError for a job that is not a flow_matching job on a video dataset. Returns a summary line.
std::string extract_features(const config::JobConfig& job, const std::string& out_dir, int64_t samples);

class FeatureSet {
 public:
  struct Sample {
    at::Tensor latents;  // [z, T', h, w] float32, normalised
    at::Tensor text;     // [L, text_dim] float32
  };

  // Reads features.json and opens the shards (mapped, read as needed). DataError naming the file for
  // a directory without features.json (an incomplete extraction), a malformed one, or shards that
  // disagree with it.
  explicit FeatureSet(const std::string& dir);

  // ConfigError naming `vae_key` / `text_key` when the features were made by a codec of other latent
  // statistics or channels, or by another text encoder (its features of the empty caption differ).
  void check_helpers(const models::LatentCodec& vae, const std::string& vae_key,
                     const CaptionEncoder& captions, const std::string& text_key) const;
  // ConfigError naming the key where the job's data section (dataset, video_size, frames, fps) is not
  // the one the features were extracted from.
  void check_source(const config::DataSection& data) const;

  int64_t train_size() const { return static_cast<int64_t>(train_.size()); }
  int64_t eval_size() const { return static_cast<int64_t>(eval_.size()); }
  Sample train(int64_t row) const { return read(train_.at(static_cast<size_t>(row))); }
  Sample eval(int64_t row) const { return read(eval_.at(static_cast<size_t>(row))); }
  int64_t train_latent_frames(int64_t row) const { return train_.at(static_cast<size_t>(row)).latent_frames; }
  int64_t eval_latent_frames(int64_t row) const { return eval_.at(static_cast<size_t>(row)).latent_frames; }
  const std::string& eval_caption(int64_t row) const { return eval_captions_.at(static_cast<size_t>(row)); }
  // The clips the features were made from: a video sample's frames and the side in pixels.
  int64_t frames() const { return frames_; }
  int64_t video_size() const { return video_size_; }
  const std::string& dir() const { return dir_; }

 private:
  struct Row {
    size_t shard = 0;
    int64_t index = 0, latent_frames = 0;
  };
  Sample read(const Row& row) const;

  std::string dir_;
  std::vector<checkpoint::SafetensorsReader> shards_;
  std::vector<at::Tensor> offsets_;  // per shard, text_offsets
  std::vector<Row> train_, eval_;
  std::vector<std::string> eval_captions_;
  std::vector<double> latents_mean_, latents_std_;
  at::Tensor empty_caption_;  // [L, text_dim]: the text encoder's features of ""
  std::string dataset_;
  double fps_ = 0;
  int64_t z_dim_ = 0, text_dim_ = 0, frames_ = 0, video_size_ = 0;
};

}  // namespace loom::tasks::flow_matching
