#include "loom/models/qwen2_vl/decoding.h"

#include <fmt/format.h>

#include "loom/util/errors.h"

namespace loom::models {

at::Tensor Qwen2VLDecoder::last_logits(const at::Tensor& hidden) const {
  return model_->whole_logits(hidden.select(1, hidden.size(1) - 1)).to(at::kFloat);
}

at::Tensor Qwen2VLDecoder::run(const VisionLanguageInputs& in) {
  try {
    return last_logits(core::run_layers(model_->layers(), {}, *model_->context(in, &cache_)).get("hidden"));
  } catch (...) {
    cache_ = KVCache{};  // a pass cut short leaves the layers' caches uneven: start again
    throw;
  }
}

at::Tensor Qwen2VLDecoder::prefill(const VisionLanguageInputs& prompts) {
  if (!prompts.cu_seqlens.empty()) throw ModelError("decoding prompts come one per row, not packed");
  if (prompts.attention_mask.defined() &&
      !prompts.attention_mask.select(1, prompts.attention_mask.size(1) - 1).all().item<bool>())
    throw ModelError("decoding prompts must be padded on the left: a row's last token is padding");
  cache_ = KVCache{};
  VisionLanguageInputs in = prompts;
  RopeIndex rope = rope_index(in.input_ids, in.image_grid_thw, in.attention_mask, model_->config);
  in.position_ids = rope.position_ids;
  deltas_ = rope.rope_deltas;
  return run(in);
}

at::Tensor Qwen2VLDecoder::step(const at::Tensor& tokens) {
  if (cache_.length() == 0) throw ModelError("decoding: step() before prefill()");
  const int64_t rows = tokens.size(0);
  if (rows != deltas_.size(0))
    throw ModelError(fmt::format("decoding: {} tokens for {} rows", rows, deltas_.size(0)));
  VisionLanguageInputs in;
  in.input_ids = tokens.to(at::kLong).view({rows, 1});
  in.position_ids = (deltas_ + cache_.length()).view({1, rows, 1}).expand({3, rows, 1}).contiguous();
  return run(in);
}

}  // namespace loom::models
