#include "loom/tasks/flow_matching/pipeline.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <filesystem>

#include "loom/data/image/decode.h"
#include "loom/data/video/gif_writer.h"
#include "loom/data/video/mp4_writer.h"
#include "loom/tasks/video/clips.h"
#include "loom/util/errors.h"

namespace loom::tasks::flow_matching {

namespace fs = std::filesystem;

std::vector<int64_t> latent_shape(const models::Denoiser& dit, const models::LatentCodec& vae,
                                  const GenerationSettings& s) {
  const auto patch = dit.patch_size();
  const int64_t spatial = vae.spatial_factor();
  if (!vae.encodes_frames(s.frames))
    throw ConfigError(fmt::format("frames: the latent codec makes {}, not {}", vae.frames_rule(), s.frames));
  const int64_t latent_frames = vae.latent_frames(s.frames);
  if (latent_frames % patch[0] != 0)
    throw ConfigError(
        fmt::format("frames: {} frames are {} latent frames, not a multiple of the DiT's patch {}", s.frames,
                    latent_frames, patch[0]));
  for (auto [name, side, p] : {std::tuple{"height", s.height, patch[1]}, {"width", s.width, patch[2]}})
    if (side < 1 || side % (spatial * p) != 0)
      throw ConfigError(
          fmt::format("{}: must be a multiple of {} (the VAE's {} x the DiT's patch {}), got {}", name,
                      spatial * p, spatial, p, side));
  return {vae.latent_channels(), latent_frames, s.height / spatial, s.width / spatial};
}

at::Tensor encode_latents(const models::LatentCodec& vae, const at::Tensor& video) {
  at::NoGradGuard no_grad;
  const at::Tensor mu = vae.encode_clips(video.to(vae.input_options().dtype()), /*chunked=*/false).mu;
  return vae.normalize_latents(mu).to(at::kFloat);
}

at::Tensor generate_videos(const models::Denoiser& dit, const models::LatentCodec& vae,
                           const CaptionEncoder& captions, const std::vector<std::string>& texts,
                           const std::vector<uint64_t>& seeds, const GenerationSettings& settings) {
  if (texts.size() != seeds.size() || texts.empty())
    throw ConfigError(fmt::format("generate: {} captions and {} seeds", texts.size(), seeds.size()));
  check_sampling(settings.sampling);
  const std::vector<int64_t> shape = latent_shape(dit, vae, settings);
  at::NoGradGuard no_grad;
  const at::Tensor unconditional = captions.encode({""})[0];
  const at::TensorOptions inputs = dit.input_options();
  std::vector<at::Tensor> videos;
  for (size_t i = 0; i < texts.size(); ++i) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(seeds[i]);
    const at::Tensor noise = at::randn(shape, generator, at::kFloat).unsqueeze(0);  // [1, z, T', h, w]
    const bool guide = settings.guidance != 1.0;
    std::vector<at::Tensor> rows = captions.encode({texts[i]});
    if (guide) rows.push_back(unconditional);
    const at::Tensor text = dit.text_batch(rows).to(inputs.device());
    auto velocity = [&](const at::Tensor& x, double timestep) {
      const int64_t batch = guide ? 2 : 1;
      const at::Tensor latents = x.expand({batch, -1, -1, -1, -1}).to(inputs.device(), inputs.dtype());
      const at::Tensor t = at::full({batch}, timestep, at::kDouble);
      const at::Tensor v = dit.forward(latents, t, text).to(at::kFloat).cpu();  // [batch, z, T', h, w]
      return guide ? guided(v.narrow(0, 1, 1), v.narrow(0, 0, 1), settings.guidance) : v;
    };
    const at::Tensor latents = sample(velocity, noise, settings.sampling);
    const at::Tensor raw = vae.denormalize_latents(latents.to(vae.input_options().dtype()));
    videos.push_back(vae.decode_latents(raw, /*chunked=*/true).to(at::kFloat).cpu().clamp(-1.0, 1.0));
  }
  return at::cat(videos);
}

}  // namespace loom::tasks::flow_matching
