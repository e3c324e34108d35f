// Incremental decoding of a vision-language model whose language model is models/text's, as
// transformers' generate() runs it: the prompts once (prefill), then one token per row per step, each
// attending over the keys and values cached before it. A family's decoder gives the positions.
#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <memory>

#include "loom/core/layer.h"
#include "loom/models/text/decoder.h"
#include "loom/models/vision_language.h"

namespace loom::models {

class CachedDecoder : public VisionLanguageDecoder {
 public:
  // Left-padded prompts (every row's last token real), not packed; starts a new cache.
  at::Tensor prefill(const VisionLanguageInputs& prompts) override;
  at::Tensor step(const at::Tensor& tokens) override;
  int64_t length() const { return cache_.length(); }  // tokens per row seen so far, padding included

 protected:
  // The context of a pass over the cache (the family's, decoding over `cache`).
  using ContextOf =
      std::function<std::shared_ptr<const core::Context>(const VisionLanguageInputs&, KVCache*)>;
  // The model must outlive the decoder.
  CachedDecoder(const VisionLanguageModel& model, ContextOf context)
      : model_(&model), context_(std::move(context)) {}
  // The prompts' position ids, and those of one new token per row (`rows`) after length() tokens.
  virtual at::Tensor prompt_positions(const VisionLanguageInputs& prompts) = 0;
  virtual at::Tensor step_positions(int64_t rows) = 0;
  const KVCache& cache() const { return cache_; }

 private:
  // One pass of the layers over the cache -> the whole logits of each row's last token (B, vocab);
  // the cache is emptied when it throws (a pass cut short leaves the layers' caches uneven).
  at::Tensor run(const VisionLanguageInputs& in);

  const VisionLanguageModel* model_;
  ContextOf context_;
  KVCache cache_;
};

}  // namespace loom::models
