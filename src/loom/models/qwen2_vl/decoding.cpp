#include "loom/models/qwen2_vl/decoding.h"

namespace loom::models {

Qwen2VLDecoder::Qwen2VLDecoder(const Qwen2VLForConditionalGeneration& model)
    : CachedDecoder(model, [&model](const VisionLanguageInputs& in,
                                    KVCache* cache) { return model.context(in, cache); }),
      model_(&model) {}

at::Tensor Qwen2VLDecoder::prompt_positions(const VisionLanguageInputs& prompts) {
  RopeIndex rope = rope_index(prompts, model_->config);
  deltas_ = rope.rope_deltas;
  return rope.position_ids;
}

at::Tensor Qwen2VLDecoder::step_positions(int64_t rows) {
  return (deltas_ + length()).view({1, rows, 1}).expand({3, rows, 1}).contiguous();
}

}  // namespace loom::models
