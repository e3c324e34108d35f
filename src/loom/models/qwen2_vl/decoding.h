// Incremental decoding of Qwen2-VL, as transformers' generate() runs it: the prompts once (prefill),
// then one token per row per step, each step attending over the keys and values the steps before it
// cached, its M-RoPE position continuing from the prompt's with the row's rope delta.
#pragma once
#include <ATen/ATen.h>

#include "loom/models/qwen2_vl/model.h"

namespace loom::models {

class Qwen2VLDecoder : public VisionLanguageDecoder {
 public:
  // The model must outlive the decoder.
  explicit Qwen2VLDecoder(const Qwen2VLForConditionalGeneration& model) : model_(&model) {}

  at::Tensor prefill(const VisionLanguageInputs& prompts) override;
  at::Tensor step(const at::Tensor& tokens) override;

  int64_t length() const { return cache_.length(); }  // tokens per row seen so far, padding included

 private:
  at::Tensor last_logits(const at::Tensor& hidden) const;
  // One pass of the layers over the cache; the cache is emptied when it throws.
  at::Tensor run(const VisionLanguageInputs& in);

  const Qwen2VLForConditionalGeneration* model_;
  KVCache cache_;
  at::Tensor deltas_;  // (B, 1): a new token's position is its index in the row plus this
};

}  // namespace loom::models
