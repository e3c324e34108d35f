// Wan2.1's causal 3D video VAE (WanVAE_ of wan/modules/vae.py): a video [B, 3, T, H, W] in [-1, 1]
// becomes latents [B, z, 1 + (T-1)/4, H/8, W/8] and back, every convolution causal in time. (Sides
// compress 2^(levels - 1)x, config.spatial_factor(): 8 for Wan2.1's four levels, written as 8 below.)
//
// Parameters carry Wan's own names (encoder.downsamples.{k}.residual.2.weight, conv1.weight,
// decoder.upsamples.{k}.time_conv.bias, ...; tests/fixtures/wan-tiny/vae/state_dict.txt). A frozen
// helper of video tasks: whole on every rank (no tensor parallelism), float32 (the reference) or
// bfloat16, run under the caller's at::NoGradGuard. Trained (task vae), it runs as four layers over a
// WanVaeContext, each clip in one pass:
//
//   encoder   context video [B, 3, T, H, W] -> hidden [B, 2z, T', h, w]
//   conv1     hidden -> mu, log_var [B, z, T', h, w]; hidden = mu + exp(log_var / 2) noise (the
//             context's noise; mu when it has none)
//   conv2     hidden -> hidden
//   decoder   hidden -> hidden [B, 3, 1 + 4(T' - 1), H, W], the reconstruction
//
// A clip runs either as one pass over all its frames, or chunk by chunk as upstream does (encode:
// frame 0, then 4 frames at a time; decode: one latent frame at a time) with a CausalCache carrying
// the frames each causal module needs from earlier chunks, so memory is bounded by one chunk's
// activations whatever the clip's length. Both give the same result (to float rounding).
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "loom/core/layer.h"
#include "loom/core/model.h"
#include "loom/models/generator.h"
#include "loom/models/wan/vae_config.h"
#include "loom/parallel/tensor.h"

namespace loom::models {

// What the causal modules of one clip keep between its chunks, each under its own address: a causal
// convolution its last input frames, a temporal resampler whether it has seen frame 0 and the frames
// its next window starts with. One per pass over a clip; a fresh one (or none) starts a clip.
class CausalCache {
 public:
  struct State {
    bool started = false;  // frame 0 has gone through (temporal resamplers)
    at::Tensor frames;     // [B, C, n, H, W] input frames the next chunk needs; undefined: none yet
  };
  State& state(const void* module) { return states_[module]; }

 private:
  std::unordered_map<const void*, State> states_;
};

namespace wan_vae {

// Conv3d whose time axis is padded causally: 2 * pad_t zero frames in front (or the frames a cache
// kept from earlier chunks), none behind; height and width symmetrically. With kernel (3, 3, 3) and
// padding 1 an output frame t sees input frames t-2..t.
class CausalConv3d : public torch::nn::Module {
 public:
  CausalConv3d(int64_t in, int64_t out, std::vector<int64_t> kernel, std::vector<int64_t> padding,
               const at::TensorOptions& options, int64_t stride_t = 1);
  // x [B, in, T, H, W] -> [B, out, T, H', W'] (stride 1). With `cache`, x continues the frames
  // earlier calls gave and this call's last input frames are kept for the next.
  at::Tensor forward(const at::Tensor& x, CausalCache* cache = nullptr) const;
  // The bare convolution, no temporal padding: x [B, in, T, H, W] -> [B, out, (T - k_t) / s_t + 1, H', W'].
  at::Tensor convolve(const at::Tensor& x) const;
  at::Tensor weight;     // [out, in, k_t, k_h, k_w]
  at::Tensor bias;       // [out]
  int64_t front_frames;  // 2 * pad_t
  std::vector<int64_t> stride, spatial_padding;
};

// Per-frame 2D convolution (nn.Conv2d): on [N, in, H, W], or on every frame of [B, in, T, H, W].
class Conv2d : public torch::nn::Module {
 public:
  Conv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding,
         const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x) const;  // [.., in, H, W] -> [.., out, H', W']
  at::Tensor weight;                              // [out, in, k, k]
  at::Tensor bias;                                // [out]
  int64_t stride, padding;
};

// Wan's RMS_norm: x / max(||x||_2 over channels, 1e-12) * sqrt(C) * gamma (F.normalize: the eps is
// on the norm, not inside a root; no bias). Statistics in float32; the fused kernel of
// loom/kernels/channel_norm.h.
class RMSNorm : public torch::nn::Module {
 public:
  // gamma [C, 1, 1, 1] for 5-D inputs (`images` false), [C, 1, 1] for 4-D ones.
  RMSNorm(int64_t channels, bool images, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x) const;       // [B, C, ...] -> [B, C, ...]
  at::Tensor forward_silu(const at::Tensor& x) const;  // silu(forward(x)), fused
  at::Tensor gamma;
};

// A member of the encoder's downsamples / the decoder's middle and upsamples sequences.
class Block : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& x, CausalCache* cache) const = 0;  // [B, C, T, H, W] -> ..
};

// residual = [0 norm, 1 SiLU, 2 conv 3^3, 3 norm, 4 SiLU, 5 dropout (0), 6 conv 3^3]; shortcut a
// 1^3 conv when the width changes. out = residual(x) + shortcut(x).
class ResidualBlock : public Block {
 public:
  ResidualBlock(int64_t in, int64_t out, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x,
                     CausalCache* cache) const override;  // [B,in,T,H,W] -> [B,out,T,H,W]
  std::shared_ptr<RMSNorm> norm1, norm2;                  // residual.0, residual.3
  std::shared_ptr<CausalConv3d> conv1, conv2;             // residual.2, residual.6
  std::shared_ptr<CausalConv3d> shortcut;                 // null when in == out
};

// Single-head self-attention over the pixels of each frame (no mixing across frames):
// x + proj(attention(to_qkv(norm(x)))), q/k/v the channel thirds [0,C), [C,2C), [2C,3C) of to_qkv.
class AttentionBlock : public Block {
 public:
  AttentionBlock(int64_t channels, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x, CausalCache* cache) const override;  // [B,C,T,H,W] -> same
  std::shared_ptr<RMSNorm> norm;                                               // gamma [C, 1, 1]
  std::shared_ptr<Conv2d> to_qkv;                                              // [3C, C, 1, 1]
  std::shared_ptr<Conv2d> proj;  // [C, C, 1, 1]; zero at initialisation
};

// Resolution changes, the spatial part per frame:
//   downsample2d  ZeroPad2d(right 1, bottom 1), then resample.1 = Conv2d(C, C, 3, stride 2): H -> H/2
//   downsample3d  the same, then time_conv (3, 1, 1) stride 2 over time, no padding: frame 0 passes
//                 untouched (no conv, no bias), output j >= 1 is the window of frames 2j-2..2j:
//                 T -> (T+1)/2 (a chunk that completes no window gives 0 frames)
//   upsample2d    nearest x2, then resample.1 = Conv2d(C, C/2, 3, padding 1): halves the width
//   upsample3d    first time_conv = CausalConv3d(C, 2C, (3, 1, 1)) over frames 1.. alone (frame 0
//                 passes untouched and is never in a window), each output frame's channel halves
//                 becoming two frames: T -> 1 + 2(T-1); then the upsample2d part.
class Resample : public Block {
 public:
  enum class Mode { downsample2d, downsample3d, upsample2d, upsample3d };
  Resample(int64_t channels, Mode mode, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x, CausalCache* cache) const override;
  Mode mode;
  std::shared_ptr<Conv2d> conv;             // resample.1
  std::shared_ptr<CausalConv3d> time_conv;  // 3d modes only

 private:
  at::Tensor downsample_time(const at::Tensor& x, CausalCache* cache) const;
  at::Tensor upsample_time(const at::Tensor& x, CausalCache* cache) const;
};

// conv1 (3 -> dim), downsamples (per level num_res_blocks residual blocks, then a downsample
// between levels), middle [residual, attention, residual], head [0 norm, 1 SiLU, 2 conv -> 2z].
class Encoder3d : public torch::nn::Module {
 public:
  Encoder3d(const WanVaeConfig& config, const at::TensorOptions& options);
  // video [B, 3, T, H, W] -> [B, 2z, T', H/8, W/8] (T' = 1 + (T-1)/4 for a whole clip of 1 + 4k frames)
  at::Tensor forward(const at::Tensor& x, CausalCache* cache) const;
  std::shared_ptr<CausalConv3d> conv1;
  std::vector<std::shared_ptr<Block>> downsamples, middle;
  std::shared_ptr<RMSNorm> head_norm;       // head.0
  std::shared_ptr<CausalConv3d> head_conv;  // head.2
};

// conv1 (z -> dim*mult[-1]), middle, upsamples (per level num_res_blocks + 1 residual blocks, then an
// upsample between levels, each halving the width), head [0 norm, 1 SiLU, 2 conv -> 3].
class Decoder3d : public torch::nn::Module {
 public:
  Decoder3d(const WanVaeConfig& config, const at::TensorOptions& options);
  // [B, z, T, h, w] -> [B, 3, 1 + 4(T-1), 8h, 8w] for a whole clip (for a chunk continuing one: 4T frames)
  at::Tensor forward(const at::Tensor& x, CausalCache* cache) const;
  std::shared_ptr<CausalConv3d> conv1;
  std::vector<std::shared_ptr<Block>> middle, upsamples;
  std::shared_ptr<RMSNorm> head_norm;
  std::shared_ptr<CausalConv3d> head_conv;
};

}  // namespace wan_vae

// What the layers of one micro-batch read (task vae): the clips (T = 1 + 4k) and the posterior's draws.
using WanVaeContext = LatentCodecContext;

// Intermediates a pass may record, for comparing against upstream's.
struct WanVaeTrace {
  at::Tensor encoder_output;  // encode: the encoder's chunks concatenated [B, 2z, T_lat, H/8, W/8]
  at::Tensor decoder_input;   // decode: conv2(latents) [B, z, T_lat, h, w]
};

class WanVAE : public torch::nn::Module, public LatentCodec {
 public:
  // options.dtype float32 or bfloat16; options.shapes_only builds on the meta device; options.tp must
  // be a single rank (ModelError otherwise). Parameters are uninitialised until loaded or initialised.
  WanVAE(const WanVaeConfig& config, const parallel::ParamOptions& options = {});

  // video [B, 3, T, H, W] in [-1, 1], H and W multiples of 8 (the spatial factor) -> raw mu and log_var
  // [B, z, T_lat, H/8, W/8], T_lat = config.latent_frames(T). Only the first 1 + 4 * ((T-1)/4) frames
  // are encoded (upstream drops the rest silently; so does this). `chunked`: frame 0, then 4 frames
  // at a time with causal caches (upstream's way, memory bounded by one chunk); otherwise one pass.
  VaeEncoding encode(const at::Tensor& video, bool chunked = true, WanVaeTrace* trace = nullptr) const;

  // latents [B, z, T_lat, h, w], raw (denormalised) -> video [B, 3, 1 + 4(T_lat-1), 8h, 8w], not
  // clamped (the pipeline clamps to [-1, 1]). `chunked`: one latent frame at a time with causal
  // caches, the output filled in place (memory: the output plus one chunk's activations and the
  // caches); otherwise one pass.
  at::Tensor decode(const at::Tensor& latents, bool chunked = true, WanVaeTrace* trace = nullptr) const;
  // The chunked decode, handing each chunk's frames [B, 3, n, 8h, 8w] to `consume` in order (n = 1,
  // then 4 per latent frame) instead of assembling the video: memory independent of the clip length.
  void decode_chunks(const at::Tensor& latents, const std::function<void(const at::Tensor&)>& consume,
                     WanVaeTrace* trace = nullptr) const;

  // (mu - mean) / std per channel: what the DiT is trained on. latents [B, z, ...] -> same. A
  // ModelError when the config has no latent scale (WanVaeConfig::has_latent_scale).
  at::Tensor normalize_latents(const at::Tensor& mu) const;
  // z * std + mean per channel: back to what decode takes.
  at::Tensor denormalize_latents(const at::Tensor& latents) const;
  // A draw from the posterior: mu + exp(0.5 * clamp(log_var, -30, 20)) * noise, noise ~ N(0, I) of
  // mu's shape, drawn by the caller (seeded per sample).
  static at::Tensor reparameterize(const VaeEncoding& encoding, const at::Tensor& noise);

  // LatentCodec
  VaeEncoding encode_clips(const at::Tensor& video, bool chunked) const override {
    return encode(video, chunked);
  }
  at::Tensor decode_latents(const at::Tensor& latents, bool chunked) const override {
    return decode(latents, chunked);
  }
  std::vector<double> latents_mean() const override { return config.latents_mean; }
  std::vector<double> latents_std() const override { return config.latents_std; }
  // config.json (to_hf_config) with these statistics, torch_dtype the weights' dtype.
  nlohmann::json hf_config_with_latent_statistics(const std::vector<double>& mean,
                                                  const std::vector<double>& std) const override;
  int64_t latent_channels() const override { return config.z_dim; }
  int64_t spatial_factor() const override { return config.spatial_factor(); }
  bool encodes_frames(int64_t frames) const override {
    return frames >= 1 && WanVaeConfig::encoded_frames(frames) == frames;
  }
  const char* frames_rule() const override { return "1 + 4k frames (5, 9, 13, ...)"; }
  int64_t latent_frames(int64_t frames) const override { return config.latent_frames(frames); }
  int64_t video_frames(int64_t latent_frames) const override { return config.video_frames(latent_frames); }
  at::TensorOptions input_options() const override { return conv1->weight.options(); }

  // core::Model
  torch::nn::Module& module() override { return *this; }
  core::Layers layers() const override { return layers_; }
  nlohmann::json hf_config() const override;  // config.json, torch_dtype the weights' dtype
  std::vector<std::string> freeze_examples() const override {
    return {"encoder", "conv1", "conv2", "decoder"};
  }

  std::shared_ptr<wan_vae::Encoder3d> encoder;
  std::shared_ptr<wan_vae::CausalConv3d> conv1;  // [2z, 2z, 1, 1, 1]: encoder output -> (mu, log_var)
  std::shared_ptr<wan_vae::CausalConv3d> conv2;  // [z, z, 1, 1, 1]: latents -> decoder input
  std::shared_ptr<wan_vae::Decoder3d> decoder;
  WanVaeConfig config;

 private:
  at::Tensor checked_video(const at::Tensor& video) const;      // cast to the weights, frames kept
  at::Tensor checked_latents(const at::Tensor& latents) const;  // cast to the weights
  at::Tensor channel_vector(const std::vector<double>& values, const at::Tensor& like) const;
  void check_latent_scale() const;
  core::Layers layers_;
};

// Initialises a VAE for training from scratch, each parameter drawn from a generator seeded by (seed,
// its name), so neither construction order nor other parameters change it: convolution weights and
// biases uniform in +-1/sqrt(fan_in of the module's weight) (PyTorch's default, kaiming-uniform with
// a = sqrt(5)), norm gains 1, the attention blocks' proj.weight 0 (as upstream; proj.bias as any bias).
void init_wan_vae_parameters(WanVAE& model, uint64_t seed);

}  // namespace loom::models
