// The language model's layers (core/layer.h) of a vision-language model whose language model is
// models/text's decoder, named under `prefix` (Qwen2-VL: "model."):
//
//   <prefix>embed_tokens  input ids, image_embeds scattered into the image tokens -> hidden
//   <prefix>layers.<i>    hidden -> hidden
//   <prefix>norm          hidden -> hidden (whole sequences)
//
// and the part of the per-micro-batch context they read, which a family's context extends with its
// vision tower's. The layers have work only when the micro-batch has input ids.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/core/layer.h"
#include "loom/models/text/decoder.h"
#include "loom/models/vision_language.h"
#include "loom/parallel/sequence.h"

namespace loom::models {

struct TextContext : VisionLanguageContext {
  at::Tensor input_ids;   // (B, L); undefined: only the vision tower runs
  at::Tensor image_mask;  // (B, L, 1): the tokens whose embeddings the image embeddings replace
  int64_t image_tokens = 0;
  at::Tensor video_mask;  // (B, L, 1): the same for the videos' embeddings; undefined: no videos
  int64_t video_tokens = 0;
  at::Tensor cos, sin;              // (B, L, 1, head_dim): the rotary tables of the tokens' positions
  std::vector<int64_t> cu_seqlens;  // packed samples of one row; empty: one per row
  parallel::SequenceChunks text_chunks;
  // Context parallelism (text_shard.enabled(), VisionLanguageContext): this rank's tokens of every
  // row as one row, causal within each sample (or row).
  parallel::ContextAttention text_attention;
  // Decoding: cached.cache set, the language layers read and extend it (so a context with a cache
  // is run once: a second run would append its tokens again).
  CachedPass cached;

  bool has_text() const { return input_ids.defined(); }
};

// The text part of `c` for `in`: `angles` (B, L, head_dim) are the rotary angles of the tokens'
// positions, `image_token` the id whose positions take the image embeddings and `video_token` (-1:
// none) the id whose positions take the videos' (the vision tower's rows after the images'). Under context
// parallelism (`cp` enabled) each packed sample (or row) is causal on its own, its tokens split
// over the cp ranks; under sequence parallelism the tables are padded to the chunks.
void add_text_context(TextContext& c, const VisionLanguageInputs& in, const at::Tensor& angles,
                      int64_t image_token, int64_t video_token, const parallel::TensorParallelGroup& tp,
                      const parallel::ContextParallelGroup* cp);

// Decoding over `cache` (one sample per row, no packing): the new tokens' mask joins the cache's, and
// each new token is allowed the real tokens up to itself, and itself.
void add_cached_pass(TextContext& c, const VisionLanguageInputs& in, KVCache& cache);

// The text part's tensors moved to `device` (without waiting where they are in pinned memory).
void move_text_context(TextContext& c, const at::Device& device);

// The language model's layers, in forward order, named under `prefix`.
core::Layers text_layers(const std::shared_ptr<TextModel>& text, const std::string& prefix);

}  // namespace loom::models
