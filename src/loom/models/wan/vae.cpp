#include "loom/models/wan/vae.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "loom/checkpoint/hf_export.h"
#include "loom/kernels/channel_norm.h"
#include "loom/models/weights.h"
#include "loom/nn/module_list.h"
#include "loom/util/errors.h"

namespace loom::models {

namespace {

// Frames [begin, begin + count) of x [B, C, T, H, W].
at::Tensor frames(const at::Tensor& x, int64_t begin, int64_t count) { return x.narrow(2, begin, count); }

at::Tensor concat_frames(const std::vector<at::Tensor>& parts) {
  return parts.size() == 1 ? parts[0] : at::cat(parts, 2);
}

}  // namespace

namespace wan_vae {

CausalConv3d::CausalConv3d(int64_t in, int64_t out, std::vector<int64_t> kernel, std::vector<int64_t> padding,
                           const at::TensorOptions& options, int64_t stride_t)
    : front_frames(2 * padding[0]), stride{stride_t, 1, 1}, spatial_padding{0, padding[1], padding[2]} {
  weight = register_parameter("weight", at::empty({out, in, kernel[0], kernel[1], kernel[2]}, options));
  bias = register_parameter("bias", at::empty({out}, options));
}

at::Tensor CausalConv3d::convolve(const at::Tensor& x) const {
  // Height and width padded by the convolution itself (zeros, as F.pad), time not at all.
  return at::conv3d(x, weight, bias, stride, spatial_padding);
}

at::Tensor CausalConv3d::forward(const at::Tensor& x, CausalCache* cache) const {
  if (front_frames == 0) return convolve(x);  // no temporal context (1x1x1 convs)
  CausalCache::State* state = cache ? &cache->state(this) : nullptr;
  const at::Tensor kept = state ? state->frames : at::Tensor();  // [B, C, <= front, H, W]
  const int64_t have = kept.defined() ? kept.size(2) : 0;
  std::vector<at::Tensor> parts;  // [zeros | kept frames | x] along time
  if (have < front_frames) {
    auto shape = x.sizes().vec();
    shape[2] = front_frames - have;
    parts.push_back(at::zeros(shape, x.options()));
  }
  if (have > 0) parts.push_back(kept);
  parts.push_back(x);
  const at::Tensor input = concat_frames(parts);  // [B, C, front + T, H, W]
  if (state) {
    // The last `front` real frames for the next chunk; a copy, so the chunk's input can be freed.
    const int64_t real = have + x.size(2), keep = std::min(front_frames, real);
    state->frames = frames(input, input.size(2) - keep, keep).clone();
  }
  return convolve(input);
}

Conv2d::Conv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride_, int64_t padding_,
               const at::TensorOptions& options)
    : stride(stride_), padding(padding_) {
  weight = register_parameter("weight", at::empty({out, in, kernel, kernel}, options));
  bias = register_parameter("bias", at::empty({out}, options));
}

at::Tensor Conv2d::forward(const at::Tensor& x) const {
  if (x.dim() == 4) return at::conv2d(x, weight, bias, stride, padding);
  // Every frame of [B, C, T, H, W] alike: a (1, k, k) 3D kernel, no reshuffle of the frames.
  return at::conv3d(x, weight.unsqueeze(2), bias, {1, stride, stride}, {0, padding, padding});
}

RMSNorm::RMSNorm(int64_t channels, bool images, const at::TensorOptions& options) {
  gamma = register_parameter(
      "gamma", images ? at::empty({channels, 1, 1}, options) : at::empty({channels, 1, 1, 1}, options));
}

at::Tensor RMSNorm::forward(const at::Tensor& x) const { return kernels::channel_rms_norm(x, gamma, false); }

at::Tensor RMSNorm::forward_silu(const at::Tensor& x) const {
  return kernels::channel_rms_norm(x, gamma, true);
}

ResidualBlock::ResidualBlock(int64_t in, int64_t out, const at::TensorOptions& options) {
  auto residual = register_module("residual", std::make_shared<nn::ModuleList>());
  norm1 = residual->add("0", std::make_shared<RMSNorm>(in, false, options));
  conv1 = residual->add("2", std::make_shared<CausalConv3d>(in, out, std::vector<int64_t>{3, 3, 3},
                                                            std::vector<int64_t>{1, 1, 1}, options));
  norm2 = residual->add("3", std::make_shared<RMSNorm>(out, false, options));
  conv2 = residual->add("6", std::make_shared<CausalConv3d>(out, out, std::vector<int64_t>{3, 3, 3},
                                                            std::vector<int64_t>{1, 1, 1}, options));
  if (in != out)
    shortcut =
        register_module("shortcut", std::make_shared<CausalConv3d>(in, out, std::vector<int64_t>{1, 1, 1},
                                                                   std::vector<int64_t>{0, 0, 0}, options));
}

at::Tensor ResidualBlock::forward(const at::Tensor& x, CausalCache* cache) const {
  at::Tensor h = conv1->forward(norm1->forward_silu(x), cache);  // [B, out, T, H, W]
  h = conv2->forward(norm2->forward_silu(h), cache);             // dropout 0: nothing between
  return h + (shortcut ? shortcut->forward(x) : x);
}

AttentionBlock::AttentionBlock(int64_t channels, const at::TensorOptions& options) {
  norm = register_module("norm", std::make_shared<RMSNorm>(channels, true, options));
  to_qkv = register_module("to_qkv", std::make_shared<Conv2d>(channels, 3 * channels, 1, 1, 0, options));
  proj = register_module("proj", std::make_shared<Conv2d>(channels, channels, 1, 1, 0, options));
}

at::Tensor AttentionBlock::forward(const at::Tensor& x, CausalCache* cache) const {
  (void)cache;  // per frame: nothing crosses chunks
  const int64_t B = x.size(0), C = x.size(1), T = x.size(2), H = x.size(3), W = x.size(4), N = B * T,
                L = H * W;
  const at::Tensor images = x.permute({0, 2, 1, 3, 4}).reshape({N, C, H, W});  // [(B T), C, H, W]
  const at::Tensor qkv =
      to_qkv->forward(norm->forward(images)).view({N, 3 * C, L}).transpose(1, 2);  // [N, L, 3C]
  const auto parts = qkv.chunk(3, -1);                                             // q, k, v [N, L, C]
  const double root = std::sqrt(static_cast<double>(C));
  // Scores [n, L, L] for a group of frames at a time, at most ~256 MiB of them.
  const int64_t group =
      std::max<int64_t>(1, (int64_t{256} << 20) / std::max<int64_t>(1, L * L * x.element_size()));
  std::vector<at::Tensor> outputs;
  for (int64_t begin = 0; begin < N; begin += group) {
    const int64_t n = std::min(group, N - begin);
    const at::Tensor q = parts[0].narrow(0, begin, n), k = parts[1].narrow(0, begin, n),
                     v = parts[2].narrow(0, begin, n);
    const at::Tensor scores = at::matmul(q, k.transpose(1, 2)) / root;  // [n, L, L]
    outputs.push_back(at::matmul(at::softmax(scores, -1), v));          // [n, L, C]
  }
  const at::Tensor attended =
      (outputs.size() == 1 ? outputs[0] : at::cat(outputs, 0)).transpose(1, 2).reshape({N, C, H, W});
  const at::Tensor out =
      proj->forward(attended).view({B, T, C, H, W}).permute({0, 2, 1, 3, 4});  // [B, C, T, H, W]
  return out + x;
}

Resample::Resample(int64_t channels, Mode mode_, const at::TensorOptions& options) : mode(mode_) {
  auto resample = register_module("resample", std::make_shared<nn::ModuleList>());
  const bool down = mode == Mode::downsample2d || mode == Mode::downsample3d;
  // Downsampling keeps the width (stride 2, padded by hand); upsampling halves it.
  conv = resample->add("1", down ? std::make_shared<Conv2d>(channels, channels, 3, 2, 0, options)
                                 : std::make_shared<Conv2d>(channels, channels / 2, 3, 1, 1, options));
  if (mode == Mode::downsample3d)
    time_conv = register_module(
        "time_conv", std::make_shared<CausalConv3d>(channels, channels, std::vector<int64_t>{3, 1, 1},
                                                    std::vector<int64_t>{0, 0, 0}, options, 2));
  if (mode == Mode::upsample3d)
    time_conv = register_module(
        "time_conv", std::make_shared<CausalConv3d>(channels, 2 * channels, std::vector<int64_t>{3, 1, 1},
                                                    std::vector<int64_t>{1, 0, 0}, options));
}

at::Tensor Resample::forward(const at::Tensor& x, CausalCache* cache) const {
  switch (mode) {
    case Mode::downsample2d:
    case Mode::downsample3d: {
      // Zero column on the right and zero row at the bottom only, then the stride-2 conv: H -> H/2.
      const at::Tensor y = conv->forward(at::constant_pad_nd(x, {0, 1, 0, 1}));  // [B, C, T, H/2, W/2]
      return mode == Mode::downsample3d ? downsample_time(y, cache) : y;
    }
    case Mode::upsample2d:
    case Mode::upsample3d: {
      const at::Tensor y = mode == Mode::upsample3d ? upsample_time(x, cache) : x;  // [B, C, T', H, W]
      // Nearest x2 (for an integer factor nearest-exact and nearest pick the same pixel), as upstream
      // in float32: a copy, exact in any dtype.
      const at::Tensor y32 = y.to(at::kFloat);
      const at::Tensor up =
          at::upsample_nearest3d(y32, {y.size(2), 2 * y.size(3), 2 * y.size(4)}).to(y.scalar_type());
      return conv->forward(up);  // [B, C/2, T', 2H, 2W]
    }
  }
  return x;
}

at::Tensor Resample::downsample_time(const at::Tensor& x, CausalCache* cache) const {
  // The whole clip f_0 .. f_{T-1} gives [f_0] ++ windows (f_{2j-2}, f_{2j-1}, f_{2j}), j >= 1. Chunk by
  // chunk, the state keeps the frames from the last window's end on (the next window starts there).
  CausalCache::State local;
  CausalCache::State& state = cache ? cache->state(this) : local;
  std::vector<at::Tensor> outputs;
  at::Tensor sequence = x;  // [B, C, n, H, W]: the frames windows may start in, in order
  if (!state.started) {
    state.started = true;
    outputs.push_back(frames(x, 0, 1));  // frame 0 passes untouched: no conv, no bias
  } else {
    sequence = at::cat({state.frames, x}, 2);
  }
  const int64_t length = sequence.size(2), windows = length >= 3 ? (length - 1) / 2 : 0;
  if (windows > 0) outputs.push_back(time_conv->convolve(frames(sequence, 0, 2 * windows + 1)));
  state.frames = frames(sequence, 2 * windows, length - 2 * windows).clone();
  // No window completed in this chunk (never with upstream's chunks of frame 0, then 4 frames).
  if (outputs.empty()) return frames(x, 0, 0);  // [B, C, 0, H, W]
  return concat_frames(outputs);                // [B, C, T', H, W]
}

at::Tensor Resample::upsample_time(const at::Tensor& x, CausalCache* cache) const {
  // Frame 0 passes untouched; frames 1.. go through a causal conv of their own (zeros before frame
  // 1, never frame 0), each output's two channel halves becoming two frames.
  CausalCache::State local;
  CausalCache::State& state = cache ? cache->state(this) : local;
  std::vector<at::Tensor> outputs;
  at::Tensor rest = x;
  if (!state.started) {
    state.started = true;
    outputs.push_back(frames(x, 0, 1));
    rest = frames(x, 1, x.size(2) - 1);
  }
  if (rest.size(2) > 0) {
    const int64_t B = rest.size(0), C = rest.size(1), T = rest.size(2), H = rest.size(3), W = rest.size(4);
    const at::Tensor doubled = time_conv->forward(rest, cache);  // [B, 2C, T, H, W]
    // Output t's channels [0, C) become frame 2t, [C, 2C) frame 2t+1.
    outputs.push_back(
        doubled.view({B, 2, C, T, H, W}).permute({0, 2, 3, 1, 4, 5}).reshape({B, C, 2 * T, H, W}));
  }
  return concat_frames(outputs);  // [B, C, T', H, W]
}

namespace {

std::vector<int64_t> level_widths(int64_t dim, const std::vector<int64_t>& multipliers) {
  std::vector<int64_t> widths;
  for (int64_t m : multipliers) widths.push_back(dim * m);
  return widths;
}

}  // namespace

Encoder3d::Encoder3d(const WanVaeConfig& c, const at::TensorOptions& options) {
  // Widths dim * [1, mult...]: level i maps widths[i] -> widths[i + 1].
  std::vector<int64_t> widths = level_widths(c.dim, c.dim_mult);
  widths.insert(widths.begin(), c.dim);
  conv1 = register_module("conv1", std::make_shared<CausalConv3d>(3, widths[0], std::vector<int64_t>{3, 3, 3},
                                                                  std::vector<int64_t>{1, 1, 1}, options));
  auto downs = register_module("downsamples", std::make_shared<nn::ModuleList>());
  const size_t levels = c.dim_mult.size();
  for (size_t i = 0; i < levels; ++i) {
    int64_t in = widths[i];
    const int64_t out = widths[i + 1];
    for (int64_t r = 0; r < c.num_res_blocks; ++r, in = out)
      downsamples.push_back(downs->append(std::make_shared<ResidualBlock>(in, out, options)));
    if (i + 1 < levels)
      downsamples.push_back(downs->append(std::make_shared<Resample>(
          out, c.temperal_downsample[i] ? Resample::Mode::downsample3d : Resample::Mode::downsample2d,
          options)));
  }
  const int64_t width = widths.back();
  auto mid = register_module("middle", std::make_shared<nn::ModuleList>());
  middle.push_back(mid->append(std::make_shared<ResidualBlock>(width, width, options)));
  middle.push_back(mid->append(std::make_shared<AttentionBlock>(width, options)));
  middle.push_back(mid->append(std::make_shared<ResidualBlock>(width, width, options)));
  auto head = register_module("head", std::make_shared<nn::ModuleList>());
  head_norm = head->add("0", std::make_shared<RMSNorm>(width, false, options));
  head_conv = head->add("2", std::make_shared<CausalConv3d>(width, 2 * c.z_dim, std::vector<int64_t>{3, 3, 3},
                                                            std::vector<int64_t>{1, 1, 1}, options));
}

at::Tensor Encoder3d::forward(const at::Tensor& video, CausalCache* cache) const {
  at::Tensor x = conv1->forward(video, cache);  // [B, dim, T, H, W]
  for (const auto& block : downsamples) x = block->forward(x, cache);
  for (const auto& block : middle) x = block->forward(x, cache);  // [B, C, T', H/8, W/8]
  return head_conv->forward(head_norm->forward_silu(x), cache);   // [B, 2z, T', H/8, W/8]
}

Decoder3d::Decoder3d(const WanVaeConfig& c, const at::TensorOptions& options) {
  // Widths dim * [mult[-1], reversed mult...]: level i maps widths[i] (halved for i >= 1 by the
  // upsample before it) -> widths[i + 1].
  std::vector<int64_t> multipliers(c.dim_mult.rbegin(), c.dim_mult.rend());
  std::vector<int64_t> widths = level_widths(c.dim, multipliers);
  widths.insert(widths.begin(), c.dim * c.dim_mult.back());
  conv1 = register_module("conv1",
                          std::make_shared<CausalConv3d>(c.z_dim, widths[0], std::vector<int64_t>{3, 3, 3},
                                                         std::vector<int64_t>{1, 1, 1}, options));
  auto mid = register_module("middle", std::make_shared<nn::ModuleList>());
  middle.push_back(mid->append(std::make_shared<ResidualBlock>(widths[0], widths[0], options)));
  middle.push_back(mid->append(std::make_shared<AttentionBlock>(widths[0], options)));
  middle.push_back(mid->append(std::make_shared<ResidualBlock>(widths[0], widths[0], options)));
  auto ups = register_module("upsamples", std::make_shared<nn::ModuleList>());
  const size_t levels = c.dim_mult.size();
  for (size_t i = 0; i < levels; ++i) {
    int64_t in = i == 0 ? widths[0] : widths[i] / 2;
    const int64_t out = widths[i + 1];
    for (int64_t r = 0; r <= c.num_res_blocks; ++r, in = out)
      upsamples.push_back(ups->append(std::make_shared<ResidualBlock>(in, out, options)));
    // The decoder upsamples time where the encoder downsampled it, in reverse level order.
    if (i + 1 < levels)
      upsamples.push_back(ups->append(std::make_shared<Resample>(
          out,
          c.temperal_downsample[levels - 2 - i] ? Resample::Mode::upsample3d : Resample::Mode::upsample2d,
          options)));
  }
  const int64_t width = widths.back();
  auto head = register_module("head", std::make_shared<nn::ModuleList>());
  head_norm = head->add("0", std::make_shared<RMSNorm>(width, false, options));
  head_conv = head->add("2", std::make_shared<CausalConv3d>(width, 3, std::vector<int64_t>{3, 3, 3},
                                                            std::vector<int64_t>{1, 1, 1}, options));
}

at::Tensor Decoder3d::forward(const at::Tensor& latents, CausalCache* cache) const {
  at::Tensor x = conv1->forward(latents, cache);  // [B, C, T, h, w]
  for (const auto& block : middle) x = block->forward(x, cache);
  for (const auto& block : upsamples) x = block->forward(x, cache);  // [B, dim, T', 8h, 8w]
  return head_conv->forward(head_norm->forward_silu(x), cache);      // [B, 3, T', 8h, 8w]
}

}  // namespace wan_vae

namespace {

const WanVaeContext& vae_context(const core::Context& context) {
  return static_cast<const WanVaeContext&>(context);
}

class VaeEncoderLayer : public core::Layer {
 public:
  explicit VaeEncoderLayer(const WanVAE& vae) : core::Layer("encoder", vae.encoder), vae_(vae) {}
  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    carry.set("hidden", vae_.encoder->forward(vae_context(context).video, nullptr));
    return carry;
  }

 private:
  const WanVAE& vae_;
};

// The posterior and its sample: mu + exp(log_var / 2) noise, log_var clamped to [-30, 20] as upstream
// reparameterises.
class VaePosteriorLayer : public core::Layer {
 public:
  explicit VaePosteriorLayer(const WanVAE& vae) : core::Layer("conv1", vae.conv1), vae_(vae) {}
  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    const auto halves = vae_.conv1->forward(carry.take("hidden")).chunk(2, 1);
    const at::Tensor& noise = vae_context(context).noise;
    carry.set("hidden", noise.defined() ? WanVAE::reparameterize({halves[0], halves[1]}, noise) : halves[0]);
    carry.set("mu", halves[0]);
    carry.set("log_var", halves[1]);
    return carry;
  }

 private:
  const WanVAE& vae_;
};

class VaeDecoderInputLayer : public core::Layer {
 public:
  explicit VaeDecoderInputLayer(const WanVAE& vae) : core::Layer("conv2", vae.conv2), vae_(vae) {}
  core::Carry forward(core::Carry carry, const core::Context&) const override {
    carry.set("hidden", vae_.conv2->forward(carry.take("hidden")));
    return carry;
  }

 private:
  const WanVAE& vae_;
};

class VaeDecoderLayer : public core::Layer {
 public:
  explicit VaeDecoderLayer(const WanVAE& vae) : core::Layer("decoder", vae.decoder), vae_(vae) {}
  core::Carry forward(core::Carry carry, const core::Context&) const override {
    carry.set("hidden", vae_.decoder->forward(carry.take("hidden"), nullptr));
    return carry;
  }

 private:
  const WanVAE& vae_;
};

}  // namespace

WanVAE::WanVAE(const WanVaeConfig& c, const parallel::ParamOptions& options) : config(c) {
  if (options.dtype != at::kFloat && options.dtype != at::kBFloat16)
    throw ModelError(
        fmt::format("Wan VAE runs in float32 or bfloat16, not {}", c10::toString(options.dtype)));
  if (options.tp.size() > 1)
    throw ModelError(
        fmt::format("Wan VAE is a frozen helper held whole on every rank; it cannot be split over {} "
                    "tensor-parallel ranks",
                    options.tp.size()));
  const at::TensorOptions o = options.tensor_options();
  const int64_t z = c.z_dim;
  encoder = register_module("encoder", std::make_shared<wan_vae::Encoder3d>(c, o));
  conv1 = register_module("conv1",
                          std::make_shared<wan_vae::CausalConv3d>(2 * z, 2 * z, std::vector<int64_t>{1, 1, 1},
                                                                  std::vector<int64_t>{0, 0, 0}, o));
  conv2 =
      register_module("conv2", std::make_shared<wan_vae::CausalConv3d>(z, z, std::vector<int64_t>{1, 1, 1},
                                                                       std::vector<int64_t>{0, 0, 0}, o));
  decoder = register_module("decoder", std::make_shared<wan_vae::Decoder3d>(c, o));
  layers_ = {std::make_shared<VaeEncoderLayer>(*this), std::make_shared<VaePosteriorLayer>(*this),
             std::make_shared<VaeDecoderInputLayer>(*this), std::make_shared<VaeDecoderLayer>(*this)};
}

at::Tensor WanVAE::checked_video(const at::Tensor& video) const {
  const int64_t f = config.spatial_factor();
  if (!video.defined() || video.dim() != 5 || video.size(1) != 3 || video.size(2) < 1)
    throw ModelError(
        fmt::format("Wan VAE encode: expected a video [B, 3, T >= 1, H, W], got [{}]",
                    video.defined() ? fmt::format("{}", fmt::join(video.sizes(), ", ")) : "undefined"));
  if (video.size(3) % f != 0 || video.size(4) % f != 0 || video.size(3) == 0 || video.size(4) == 0)
    throw ModelError(
        fmt::format("Wan VAE encode: height and width must be positive multiples of {}, got {}x{}", f,
                    video.size(3), video.size(4)));
  const at::Tensor& w = conv1->weight;
  return frames(video, 0, WanVaeConfig::encoded_frames(video.size(2))).to(w.device(), w.scalar_type());
}

at::Tensor WanVAE::checked_latents(const at::Tensor& latents) const {
  if (!latents.defined() || latents.dim() != 5 || latents.size(1) != config.z_dim || latents.size(2) < 1 ||
      latents.size(3) < 1 || latents.size(4) < 1)
    throw ModelError(
        fmt::format("Wan VAE decode: expected latents [B, {}, T >= 1, h, w], got [{}]", config.z_dim,
                    latents.defined() ? fmt::format("{}", fmt::join(latents.sizes(), ", ")) : "undefined"));
  const at::Tensor& w = conv2->weight;
  return latents.to(w.device(), w.scalar_type());
}

VaeEncoding WanVAE::encode(const at::Tensor& video, bool chunked, WanVaeTrace* trace) const {
  const at::Tensor x = checked_video(video);  // [B, 3, 1 + 4k, H, W]
  at::Tensor encoded;                         // [B, 2z, 1 + k', H/8, W/8]
  if (chunked) {
    CausalCache cache;
    std::vector<at::Tensor> parts{encoder->forward(frames(x, 0, 1), &cache)};
    for (int64_t begin = 1; begin < x.size(2); begin += 4)
      parts.push_back(encoder->forward(frames(x, begin, 4), &cache));
    encoded = at::cat(parts, 2);
  } else {
    encoded = encoder->forward(x, nullptr);
  }
  if (trace) trace->encoder_output = encoded;
  const auto halves = conv1->forward(encoded).chunk(2, 1);
  return {halves[0].contiguous(), halves[1].contiguous()};
}

void WanVAE::decode_chunks(const at::Tensor& latents, const std::function<void(const at::Tensor&)>& consume,
                           WanVaeTrace* trace) const {
  const at::Tensor x = conv2->forward(checked_latents(latents));  // [B, z, T_lat, h, w]
  if (trace) trace->decoder_input = x;
  CausalCache cache;
  for (int64_t t = 0; t < x.size(2); ++t) consume(decoder->forward(frames(x, t, 1), &cache));
}

at::Tensor WanVAE::decode(const at::Tensor& latents, bool chunked, WanVaeTrace* trace) const {
  if (!chunked) {
    const at::Tensor x = conv2->forward(checked_latents(latents));
    if (trace) trace->decoder_input = x;
    return decoder->forward(x, nullptr);
  }
  at::Tensor video;  // [B, 3, 1 + 4(T_lat - 1), 8h, 8w], filled chunk by chunk
  int64_t filled = 0;
  decode_chunks(
      latents,
      [&](const at::Tensor& chunk) {
        if (!video.defined()) {
          auto shape = chunk.sizes().vec();
          shape[2] = config.video_frames(latents.size(2));
          video = at::empty(shape, chunk.options());
        }
        frames(video, filled, chunk.size(2)).copy_(chunk);
        filled += chunk.size(2);
      },
      trace);
  return video;
}

at::Tensor WanVAE::channel_vector(const std::vector<double>& values, const at::Tensor& like) const {
  if (!like.defined() || like.dim() < 2 || like.size(1) != config.z_dim)
    throw ModelError(
        fmt::format("Wan VAE latents: expected [B, {}, ...], got [{}]", config.z_dim,
                    like.defined() ? fmt::format("{}", fmt::join(like.sizes(), ", ")) : "undefined"));
  std::vector<int64_t> shape(like.dim(), 1);
  shape[1] = config.z_dim;
  return at::tensor(values, at::kDouble).to(like.options()).view(shape);  // [1, z, 1, ...]
}

void WanVAE::check_latent_scale() const {
  if (!config.has_latent_scale())
    throw ModelError(
        fmt::format("Wan VAE: its config.json has no latents_mean / latents_std, and Wan2.1's are for 16 "
                    "latent channels, "
                    "not its {}: give the per-channel statistics of its latents",
                    config.z_dim));
}

at::Tensor WanVAE::normalize_latents(const at::Tensor& mu) const {
  check_latent_scale();
  return (mu - channel_vector(config.latents_mean, mu)) / channel_vector(config.latents_std, mu);
}

at::Tensor WanVAE::denormalize_latents(const at::Tensor& latents) const {
  check_latent_scale();
  return latents * channel_vector(config.latents_std, latents) + channel_vector(config.latents_mean, latents);
}

at::Tensor WanVAE::reparameterize(const VaeEncoding& encoding, const at::Tensor& noise) {
  if (noise.sizes() != encoding.mu.sizes())
    throw ModelError(fmt::format("Wan VAE reparameterize: noise [{}] does not match mu [{}]",
                                 fmt::join(noise.sizes(), ", "), fmt::join(encoding.mu.sizes(), ", ")));
  return encoding.mu + at::exp(0.5 * encoding.log_var.clamp(-30.0, 20.0)) * noise;
}

nlohmann::json WanVAE::hf_config() const {
  nlohmann::json hf = to_hf_config(config);
  hf["torch_dtype"] = checkpoint::hf_torch_dtype(conv1->weight.scalar_type());
  return hf;
}

nlohmann::json WanVAE::hf_config_with_latent_statistics(const std::vector<double>& mean,
                                                        const std::vector<double>& std) const {
  WanVaeConfig with = config;
  with.latents_mean = mean;
  with.latents_std = std;
  nlohmann::json hf = to_hf_config(with);
  hf["torch_dtype"] = checkpoint::hf_torch_dtype(conv1->weight.scalar_type());
  return hf;
}

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void init_wan_vae_parameters(WanVAE& model, uint64_t seed) {
  at::NoGradGuard no_grad;
  const auto parameters = named_parameters(model);
  std::unordered_map<std::string, int64_t> fan_in;  // per module path, from its weight [out, in, k...]
  for (const auto& [name, p] : parameters)
    if (ends_with(name, ".weight")) fan_in[name.substr(0, name.size() - 7)] = p.numel() / p.size(0);
  for (const auto& [name, p] : parameters) {
    if (p.is_meta()) continue;
    at::Tensor param = p;
    if (ends_with(name, ".gamma")) {
      param.fill_(1.0);
    } else if (ends_with(name, ".proj.weight")) {
      param.zero_();  // the attention blocks start as the identity
    } else {
      const std::string path = name.substr(0, name.rfind('.'));
      const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in.at(path)));
      auto generator = at::make_generator<at::CPUGeneratorImpl>(derive_seed(seed, "init/" + name));
      at::Tensor values = at::empty(param.sizes(), at::kFloat);
      values.uniform_(-bound, bound, generator);
      param.copy_(values);
    }
  }
}

}  // namespace loom::models
