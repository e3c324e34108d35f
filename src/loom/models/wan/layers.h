// The Wan2.1 DiT (models/wan/dit.h) as an ordered list of layers (core/layer.h), with the carry
// entries each reads and writes:
//
//   time_embedding    context timesteps -> time_embedding e [B, C] float32
//   time_projection   time_embedding -> time_modulation e0 [B, 6, C] float32
//   text_embedding    context text -> context [B, text_len, C]
//   patch_embedding   context latents -> hidden [B, L, C] float32 (the residual stream)
//   blocks.<i>        hidden, time_modulation, context -> hidden (FSDP blocks)
//   head              hidden, time_embedding -> hidden [B, L, pt ph pw C_out] float32, patch tokens with
//                     the channel innermost; time_embedding, time_modulation and context are dropped
//
// A task compares the head's tokens with a target in the same layout (ops.h head_tokens) or
// unpatchifies them (ops.h unpatchify with the context's grid).
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "loom/core/layer.h"
#include "loom/models/generator.h"
#include "loom/models/wan/config.h"
#include "loom/models/wan/ops.h"
#include "loom/parallel/context/shard.h"

namespace loom::models {

class WanModel;

// What every layer of one micro-batch reads, built once before the first layer. One latent shape per
// micro-batch (bucket samples by latent shape): no token padding, no attention mask.
struct WanContext : DenoiserContext {
  at::Tensor latents;    // [B, C_in, T, H, W], x_t
  at::Tensor timesteps;  // [B] float64, the caller's values (Wan casts them to float64 for the sinusoid)
  at::Tensor text;       // [B, text_len, text_dim], zero rows past each prompt
  WanGrid grid;          // the token grid (T / pt, H / ph, W / pw); L = grid.tokens()
  at::Tensor rope_cos, rope_sin;  // (L, 1, head_dim / 2) float32, from float64 angles
  std::vector<int64_t> self_cu;   // {0, L, 2L, ..., B L}: one self-attention segment per sample
  // Context parallelism (shard.enabled()): this rank's positions of every sample's tokens (the rope
  // tables are theirs), and how the self-attention runs over them.
  parallel::ContextAttention self_attention;
};

// The context of one micro-batch, checked against the config: latents [B, C_in, T, H, W] with T, H, W
// multiples of the patch, timesteps [B], text [B, L_text <= text_len, text_dim] zero-padded here to
// text_len rows. Tensors stay on the latents' device.
// With a context-parallel group of more than one rank, the tokens are sharded over it (rows layout).
std::shared_ptr<const WanContext> wan_context(const WanConfig& config, const at::Tensor& latents,
                                              const at::Tensor& timesteps, const at::Tensor& text,
                                              const parallel::ContextParallelGroup* cp = nullptr);

// Per-prompt text features [L_i, text_dim] (trimmed to each prompt's length, L_i <= text_len) as one
// [B, text_len, text_dim] tensor with zero rows past each prompt, as Wan pads them.
at::Tensor pad_text(const std::vector<at::Tensor>& prompts, int64_t text_len);

// The layers of a built model, in forward order.
core::Layers wan_layers(const WanModel& model);

}  // namespace loom::models
