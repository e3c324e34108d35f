// The models of a generator as tasks and commands see them: a denoiser over latents conditioned on
// text features, the latent codec between clips and those latents, and the text encoder whose
// features the denoiser reads. flow_matching (training, evaluation, sampling), vae, loom generate and
// loom forward are written against these interfaces; each family (models/<family>/) implements its
// kind (models/family.h ModelKind: denoiser, latent_codec, text_encoder).
#pragma once
#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "loom/core/model.h"
#include "loom/parallel/context/shard.h"

namespace loom::models {

// What a denoiser's layers read for one micro-batch, built once before the first layer; a family's
// context derives from it.
struct DenoiserContext : core::Context {
  // Context parallelism (shard.enabled()): the last layer's "hidden" holds this rank's positions of
  // every sample's output tokens; shard.scatter_rows gives their targets.
  parallel::ContextShard shard;
};

class Denoiser : public core::Model {
 public:
  // latents [B, C_in, T, H, W] (x_t), timesteps [B] (1000 sigma), text [B, text_len, text_dim] (as
  // text_batch makes it) -> the prediction [B, C_out, T, H, W] float32, whole, without the layers'
  // pipeline or context-parallel split (sampling).
  virtual at::Tensor forward(const at::Tensor& latents, const at::Tensor& timesteps,
                             const at::Tensor& text) const = 0;
  // The context the layers read for these inputs. `sharded`: a training pass, whose tokens are split
  // over the model's context-parallel group when it has one; otherwise the whole micro-batch.
  virtual std::shared_ptr<const DenoiserContext> context(const at::Tensor& latents,
                                                         const at::Tensor& timesteps, const at::Tensor& text,
                                                         bool sharded) const = 0;
  // A target [B, C_out, T, H, W] in the layout of the last layer's "hidden" (e.g. patch tokens
  // [B, L, patch volume x C_out]).
  virtual at::Tensor output_tokens(const at::Tensor& target) const = 0;
  // Per-caption features [L_i, text_dim] as the text input of one batch [B, text_len, text_dim].
  virtual at::Tensor text_batch(const std::vector<at::Tensor>& captions) const = 0;
  virtual int64_t in_channels() const = 0;
  virtual int64_t out_channels() const = 0;
  virtual int64_t text_dim() const = 0;
  virtual int64_t text_len() const = 0;  // caption tokens, the end token included
  // The latent patch (T, H, W) its tokens are cut into: latent sides must be multiples of it.
  virtual std::array<int64_t, 3> patch_size() const = 0;
  // Tokens of one sample of latents [B, C_in, T, H, W], and the training FLOPs (forward and backward)
  // of the whole batch.
  virtual int64_t tokens(const at::Tensor& latents) const = 0;
  virtual double training_flops(const at::Tensor& latents) const = 0;
  // The device and dtype its inputs are given in (those of its parameters).
  virtual at::TensorOptions input_options() const = 0;
};

// An encoder's posterior over the latents, raw (not normalised by the latent statistics).
struct VaeEncoding {
  at::Tensor mu;       // [B, z, T', h, w]
  at::Tensor log_var;  // [B, z, T', h, w]
};

// What a latent codec's layers read for one training micro-batch (task vae): the clips, and the
// posterior's draws. Its layers carry "hidden" (the reconstruction), "mu" and "log_var".
struct LatentCodecContext : core::Context {
  at::Tensor video;  // [B, 3, T, H, W] in [-1, 1]
  at::Tensor noise;  // [B, z, T', h, w] N(0, I) draws for the posterior sample; undefined: use mu
};

class LatentCodec : public core::Model {
 public:
  // video [B, 3, T, H, W] in [-1, 1] -> the raw posterior [B, z, T', h, w]. `chunked`: memory bounded
  // by a chunk of frames; otherwise one pass (the same numbers).
  virtual VaeEncoding encode_clips(const at::Tensor& video, bool chunked) const = 0;
  // raw latents [B, z, T', h, w] -> video [B, 3, T, H, W], not clamped.
  virtual at::Tensor decode_latents(const at::Tensor& latents, bool chunked) const = 0;
  // Raw latents to what a denoiser is trained on, and back: per channel (mu - mean) / std and its
  // inverse. ModelError when the codec has no latent statistics.
  virtual at::Tensor normalize_latents(const at::Tensor& mu) const = 0;
  virtual at::Tensor denormalize_latents(const at::Tensor& latents) const = 0;
  // The per-channel latent statistics (empty: none) and the config.json that carries others.
  virtual std::vector<double> latents_mean() const = 0;
  virtual std::vector<double> latents_std() const = 0;
  virtual nlohmann::json hf_config_with_latent_statistics(const std::vector<double>& mean,
                                                          const std::vector<double>& std) const = 0;
  virtual int64_t latent_channels() const = 0;
  // Pixels per latent position along each side.
  virtual int64_t spatial_factor() const = 0;
  // Whether a clip of `frames` is encoded whole; what the rule is, for errors ("1 + 4k frames (5, 9,
  // 13, ...)"); the latent frames of such a clip, and the frames decoded from `latent_frames`.
  virtual bool encodes_frames(int64_t frames) const = 0;
  virtual const char* frames_rule() const = 0;
  virtual int64_t latent_frames(int64_t frames) const = 0;
  virtual int64_t video_frames(int64_t latent_frames) const = 0;
  virtual at::TensorOptions input_options() const = 0;
};

class TextEncoder : public core::Model {
 public:
  // input_ids and attention_mask (B, L) int64 -> features (B, L, width()) in the model's dtype. Runs
  // under the caller's at::NoGradGuard.
  virtual at::Tensor encode(const at::Tensor& input_ids, const at::Tensor& attention_mask) const = 0;
  virtual int64_t width() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t eos_token_id() const = 0;
};

}  // namespace loom::models
