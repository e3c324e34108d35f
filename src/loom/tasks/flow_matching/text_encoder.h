// The frozen text encoder of a flow-matching job: captions to its features, each trimmed to its own
// tokens (the denoiser pads them back, Denoiser::text_batch), the most recent kCachedCaptions cached.
#pragma once
#include <ATen/ATen.h>

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "loom/config/config.h"
#include "loom/data/tokenizer/tokenizer.h"
#include "loom/models/generator.h"

namespace loom::tasks::flow_matching {

class CaptionEncoder {
 public:
  // model.text_encoder: a text encoder's model directory (models/registry.h load_frozen_model), whose
  // tokenizer (spiece.model or tokenizer.json) sits beside its weights; or an inline config (e.g.
  // a text encoder's config.json fields), its weights drawn from `seed`, tokenized with
  // `builtin` (the built-in set's words; ConfigError naming the key when there is none, or when the
  // config's vocabulary is smaller than the tokenizer's). Captions are cut to `text_len` tokens.
  CaptionEncoder(const config::ModelSection& model, uint64_t seed,
                 std::shared_ptr<const data::Tokenizer> builtin, int64_t text_len);

  // The features of each caption, [L_i, d_model] float32 with L_i its tokens and the end token (the
  // empty caption: the end token alone). Safe to call from several threads at once.
  std::vector<at::Tensor> encode(const std::vector<std::string>& captions) const;
  // Token ids of a caption: its words, then the end token, at most text_len in all.
  std::vector<int64_t> token_ids(const std::string& caption) const;
  int64_t width() const { return model_->width(); }
  // Moves the encoder to `device`: features are computed, and kept, there.
  void to(const at::Device& device);

  // Captions whose features are kept: the built-in set's all; the user's recent ones, first in first out.
  static constexpr size_t kCachedCaptions = 4096;

 private:
  std::shared_ptr<models::TextEncoder> model_;
  std::shared_ptr<const data::Tokenizer> tokenizer_;
  int64_t text_len_;
  at::Device device_ = at::kCPU;
  mutable std::mutex mutex_;
  mutable std::map<std::string, at::Tensor> cache_;
  mutable std::deque<std::string> cached_order_;  // oldest first
};

}  // namespace loom::tasks::flow_matching
