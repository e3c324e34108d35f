#include "loom/models/text/decoding.h"

#include <fmt/format.h>

#include "loom/util/errors.h"

namespace loom::models {

at::Tensor CachedDecoder::run(const VisionLanguageInputs& in) {
  try {
    const at::Tensor hidden = core::run_layers(model_->layers(), {}, *context_(in, &cache_)).get("hidden");
    return model_->whole_logits(hidden.select(1, hidden.size(1) - 1)).to(at::kFloat);
  } catch (...) {
    cache_ = KVCache{};
    throw;
  }
}

at::Tensor CachedDecoder::prefill(const VisionLanguageInputs& prompts) {
  if (!prompts.cu_seqlens.empty()) throw ModelError("decoding prompts come one per row, not packed");
  if (prompts.attention_mask.defined() &&
      !prompts.attention_mask.select(1, prompts.attention_mask.size(1) - 1).all().item<bool>())
    throw ModelError("decoding prompts must be padded on the left: a row's last token is padding");
  cache_ = KVCache{};
  VisionLanguageInputs in = prompts;
  in.position_ids = prompt_positions(in);
  return run(in);
}

at::Tensor CachedDecoder::step(const at::Tensor& tokens) {
  if (cache_.length() == 0) throw ModelError("decoding: step() before prefill()");
  const int64_t rows = tokens.size(0);
  if (rows != cache_.valid.size(0))
    throw ModelError(fmt::format("decoding: {} tokens for {} rows", rows, cache_.valid.size(0)));
  VisionLanguageInputs in;
  in.input_ids = tokens.to(at::kLong).view({rows, 1});
  in.position_ids = step_positions(rows);
  return run(in);
}

}  // namespace loom::models
