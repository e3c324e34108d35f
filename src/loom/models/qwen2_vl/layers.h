// Qwen2-VL / Qwen2.5-VL as an ordered list of layers (core/layer.h):
//
//   visual.patch_embed    pixel rows -> vision_hidden (window order, this rank's chunk under
//                         sequence parallelism)
//   visual.blocks.<i>     vision_hidden -> vision_hidden
//   visual.merger         vision_hidden -> image_embeds (whole, in row order)
//   model.embed_tokens    input ids, image_embeds scattered into the image tokens -> hidden
//   model.layers.<i>      hidden -> hidden
//   model.norm            hidden -> hidden (whole sequences)
//
// The LM head is not a layer: the task applies it to the last layer's hidden states, fused into its
// loss (the vocabulary-parallel cross entropy reads the head's slice directly). The vision layers
// have work only when the micro-batch has images, the language layers only when it has input ids.
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "loom/core/layer.h"
#include "loom/models/qwen2_vl/config.h"
#include "loom/models/text/decoder.h"
#include "loom/models/text/layers.h"
#include "loom/models/vision_language.h"
#include "loom/parallel/sequence.h"

namespace loom::models {

class VisionTransformer;

// What every layer of one micro-batch reads, built once before the first layer.
struct Qwen2VLContext : TextContext {
  // Vision tower (pixel_values undefined: no images).
  at::Tensor pixel_values;                   // (patches, C*T*P*P)
  at::Tensor vision_cos, vision_sin;         // (patches, 1, head_dim), in window order
  std::vector<int64_t> frame_cu, window_cu;  // attention segments: per frame, per window
  at::Tensor unit_order, unit_restore;       // Qwen2.5-VL: merge units into window order and back
  parallel::SequenceChunks vision_chunks;
  // Context parallelism (vision_shard.enabled()): this rank's rows, in frames, and how the full and
  // the window attention run over them.
  parallel::ContextShard vision_shard;
  parallel::ContextAttention frame_attention, window_attention;
  // The language model's (TextContext): its rotary tables are M-RoPE's.

  bool has_images() const { return pixel_values.defined(); }
};

// The context of `inputs`: position ids (rope_index unless given), the rotary tables, attention
// segments, window index and sequence-parallel padding of the vision tower and the LLM. With a
// cache (decoding; one sample per row, no packing), the input ids are the tokens after those cached
// and their attention mask is added to the cache's now: each new token sees the real tokens before
// it and itself (a padding token only itself). With a context-parallel group of more than one rank
// (and no cache), the vision rows and the text tokens are sharded over it: the rotary tables are
// this rank's, and the attention runs as the shards' plans say. Positions, tables and plans are
// worked out on the CPU from the inputs there; what the layers compute with is then moved to
// `device` (the weights'), without waiting where the inputs are in pinned memory.
std::shared_ptr<const Qwen2VLContext> qwen2vl_context(const VisionLanguageInputs& inputs,
                                                      const Qwen2VLConfig& config,
                                                      const parallel::TensorParallelGroup& vision_tp,
                                                      const parallel::TensorParallelGroup& text_tp,
                                                      const at::Device& device, KVCache* cache = nullptr,
                                                      const parallel::ContextParallelGroup* cp = nullptr);

// The layers of a built model, in forward order.
core::Layers qwen2vl_layers(const std::shared_ptr<VisionTransformer>& visual,
                            const std::shared_ptr<TextModel>& text, const Qwen2VLConfig& config);

}  // namespace loom::models
