// Sampling clips for captions with a denoiser, its latent codec and its caption encoder (the evaluation's
// samples and loom generate): seeded noise in latent space, the flow ODE solved from noise to data
// with classifier-free guidance against the empty caption, the latents decoded chunk by chunk; and
// writing a clip as PNG frames, an animated GIF and an MP4.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "loom/models/generator.h"
#include "loom/tasks/flow_matching/sampler.h"
#include "loom/tasks/flow_matching/text_encoder.h"
#include "loom/tasks/video/clips.h"

namespace loom::tasks::flow_matching {

struct GenerationSettings {
  // frames as the codec encodes them whole; sides multiples of its spatial factor x the denoiser's patch
  int64_t frames = 9, height = 48, width = 48;
  double guidance = 5.0;  // 1: the conditional velocity alone
  SamplingOptions sampling;
};

// One clip per caption, the noise of caption i drawn from seeds[i]: [N, 3, T, H, W] float32, clamped
// to [-1, 1]. Runs without gradients. ConfigError naming the setting when the clip does not fit the
// models.
at::Tensor generate_videos(const models::Denoiser& dit, const models::LatentCodec& vae,
                           const CaptionEncoder& captions, const std::vector<std::string>& texts,
                           const std::vector<uint64_t>& seeds, const GenerationSettings& settings);

// The normalised posterior means x0 [B, z, T', h, w] float32 of clips [B, 3, T, H, W] in [-1, 1], without
// gradients: what flow matching learns to make, and what extract-features stores.
at::Tensor encode_latents(const models::LatentCodec& vae, const at::Tensor& video);

// The latent shape [z, T', h, w] of a clip of these settings; ConfigError naming the setting when the
// codec and the denoiser's patch do not divide it.
std::vector<int64_t> latent_shape(const models::Denoiser& dit, const models::LatentCodec& vae,
                                  const GenerationSettings& settings);

}  // namespace loom::tasks::flow_matching
