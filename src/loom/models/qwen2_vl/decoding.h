// Incremental decoding of Qwen2-VL (models/text/decoding.h): M-RoPE positions for the prompts, and
// each new token's continuing from the prompt's with the row's rope delta.
#pragma once
#include <ATen/ATen.h>

#include "loom/models/qwen2_vl/model.h"
#include "loom/models/text/decoding.h"

namespace loom::models {

class Qwen2VLDecoder : public CachedDecoder {
 public:
  // The model must outlive the decoder.
  explicit Qwen2VLDecoder(const Qwen2VLForConditionalGeneration& model);

 protected:
  at::Tensor prompt_positions(const VisionLanguageInputs& prompts) override;
  at::Tensor step_positions(int64_t rows) override;

 private:
  const Qwen2VLForConditionalGeneration* model_;
  at::Tensor deltas_;  // (B, 1): a new token's position is its index in the row plus this
};

}  // namespace loom::models
