// Loom's Wan2.1 VAE against outputs of the official Wan2.1 code (wan/modules/vae.py) on a tiny random
// model (tests/fixtures/wan-tiny/vae, see the README beside it): encode and decode, both chunk by chunk
// with causal caches (upstream's way) and as one pass over the whole clip. The expected outputs are
// only compared against, never fed into the computation (decode's input tX_mu is an input there too).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "loom/models/wan/vae.h"
#include "loom/models/wan/vae_config.h"
#include "loom/models/weights.h"
#include "loom/util/errors.h"
#include "reference_fixture.h"

namespace loom::models {
namespace {

const std::string kDir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/wan-tiny/vae";
const testing::ReferenceFixture kFixture(kDir, "wan-tiny vae");
nlohmann::json read_json(const std::string& name) { return kFixture.json(name); }
at::Tensor read_f32(const std::string& name, at::IntArrayRef shape) { return kFixture.f32(name, shape); }
double max_abs_diff(const std::string& what, const at::Tensor& actual, const at::Tensor& expected) {
  return kFixture.max_abs_diff(what, actual, expected);
}
using testing::message_of;
// The README: an independent float32 implementation reaches 2e-6; 2e-5 is comfortable.
constexpr double kTolerance = 2e-5;
// Chunked against one pass, or a clip alone against it in a batch: the same arithmetic, blocked
// differently by the convolutions (float32 rounding on values of magnitude ~1: 2e-6 seen).
constexpr double kRegrouped = 5e-6;
constexpr int64_t kZ = 4, kSize = 32, kLatentSize = 4;

// The fixture's config.json holds WanVAE_'s constructor arguments only; its latent scale (neutral:
// mean 0, std 1) was passed to encode/decode, and io.json records it.
nlohmann::json fixture_config_json() {
  nlohmann::json config = read_json("config.json");
  const nlohmann::json scale = read_json("io.json")["scale"];
  config["latents_mean"] = scale["mean"];
  config["latents_std"] = scale["std"];
  return config;
}

WanVaeConfig fixture_config() { return parse_wan_vae_config(fixture_config_json(), kDir + "/config.json"); }

std::shared_ptr<WanVAE> loaded_model() {
  auto model = std::make_shared<WanVAE>(fixture_config());
  load_parameters(*model, kDir);
  model->eval();
  return model;
}

struct Case {
  std::string name;  // file prefix
  int64_t frames, latent_frames;
};
const std::vector<Case> kCases = {{"t5", 5, 2}, {"t9", 9, 3}};

std::vector<int64_t> video_shape(int64_t frames) { return {1, 3, frames, kSize, kSize}; }
std::vector<int64_t> latent_shape(int64_t frames) { return {1, kZ, frames, kLatentSize, kLatentSize}; }

TEST(WanVaeConfig, ReadsTheFixtureConfig) {
  const WanVaeConfig c = fixture_config();
  EXPECT_EQ(c.dim, 8);
  EXPECT_EQ(c.z_dim, 4);
  EXPECT_EQ(c.dim_mult, (std::vector<int64_t>{1, 2, 4, 4}));
  EXPECT_EQ(c.num_res_blocks, 1);
  EXPECT_TRUE(c.attn_scales.empty());
  EXPECT_EQ(c.temperal_downsample, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(c.dropout, 0.0);
  EXPECT_EQ(c.latents_mean, (std::vector<double>{0, 0, 0, 0}));
  EXPECT_EQ(c.latents_std, (std::vector<double>{1, 1, 1, 1}));
  EXPECT_EQ(c.temporal_factor(), 4);
  EXPECT_EQ(c.latent_frames(1), 1);
  EXPECT_EQ(c.latent_frames(5), 2);
  EXPECT_EQ(c.latent_frames(6), 2);  // upstream drops frames past 1 + 4k
  EXPECT_EQ(c.latent_frames(9), 3);
  EXPECT_EQ(c.latent_frames(81), 21);
  EXPECT_EQ(c.video_frames(21), 81);

  // Written back with the fields Loom does not use, and read again as the same VAE.
  const nlohmann::json hf = to_hf_config(c);
  EXPECT_EQ(hf["_class_name"], "WanVAE_");
  EXPECT_EQ(hf["temperal_downsample"], nlohmann::json::array({false, true, true}));
  const WanVaeConfig again = parse_wan_vae_config(hf, "written");
  EXPECT_EQ(again.dim_mult, c.dim_mult);
  EXPECT_EQ(again.temperal_downsample, c.temperal_downsample);
  EXPECT_EQ(again.latents_std, c.latents_std);
  EXPECT_EQ(to_hf_config(again), hf);
}

// The fixture's z_dim is 4: Wan2.1's 16 statistics do not apply, and nothing is guessed: it encodes
// and decodes (loom forward on the fixture directory), and only normalising its latents is refused.
TEST(WanVaeConfig, WithoutALatentScaleOnlyNormalisingIsRefused) {
  const WanVaeConfig bare = wan_vae_config_from_dir(kDir);
  EXPECT_FALSE(bare.has_latent_scale());
  EXPECT_FALSE(to_hf_config(bare).contains("latents_mean"));
  parallel::ParamOptions meta;
  meta.shapes_only = true;
  const WanVAE model(bare, meta);
  const std::string message = message_of<ModelError>([&] {
    model.normalize_latents(at::zeros({1, bare.z_dim, 1, 1, 1}));
  });
  EXPECT_NE(message.find("no latents_mean / latents_std"), std::string::npos) << message;
  // With z_dim 16 they default to Wan2.1's.
  nlohmann::json config = read_json("config.json");
  config["z_dim"] = 16;
  const WanVaeConfig c = parse_wan_vae_config(config, "config.json");
  EXPECT_EQ(c.latents_mean, wan21_latents_mean());
  EXPECT_EQ(c.latents_std, wan21_latents_std());
  EXPECT_EQ(c.latents_mean[7], 1.5508);
  EXPECT_EQ(c.latents_std[15], 1.9160);
}

TEST(WanVaeConfig, RefusesWhatItCannotRun) {
  struct Refusal {
    const char* key;
    nlohmann::json value;  // null: the key removed
    std::string expected;
  };
  const std::vector<Refusal> cases = {
      {"attn_scales", {0.5}, "config.json: attn_scales: must be empty, got [0.5]"},
      {"dim_mult", {1, 2, 4, 4, 4}, "config.json: dim_mult: must have 2 to 4 levels"},
      {"dim_mult", {1}, "config.json: dim_mult: must have 2 to 4 levels"},
      {"dim_mult", {1, 0, 4, 4}, "config.json: dim_mult: must be positive"},
      {"temperal_downsample",
       {false, true},
       "config.json: temperal_downsample: needs one entry per level transition (3), got 2"},
      {"temperal_downsample", {true, true, true}, "config.json: temperal_downsample: at most two levels"},
      {"temperal_downsample", {0, 1, 1}, "config.json: temperal_downsample: expected a list of booleans"},
      {"dropout", 0.1, "config.json: dropout: only 0 is supported, got 0.1"},
      {"dim", 0, "config.json: dim: must be positive, got 0"},
      {"dim", nullptr, "config.json: dim: missing required field"},
      {"z_dim", "4", "config.json: z_dim: expected an integer, got \"4\""},
      {"num_res_blocks", 0, "config.json: num_res_blocks: must be positive, got 0"},
      {"latents_mean", {0, 0, 0}, "config.json: latents_mean: needs z_dim = 4 values, got 3"},
      {"latents_std", {1, 0, 1, 1}, "config.json: latents_std: must be positive, got 0"},
      {"latents_std", nullptr, "config.json: latents_std: required with latents_mean"},
      {"_class_name", "AutoencoderKLWan",
       "config.json: _class_name: diffusers' AutoencoderKLWan layout is not supported"},
      {"_class_name", "WanModel", "config.json: _class_name: 'WanModel' is not Wan's VAE"},
  };
  for (const auto& c : cases) {
    nlohmann::json config = fixture_config_json();
    if (c.value.is_null())
      config.erase(c.key);
    else
      config[c.key] = c.value;
    const std::string message = message_of<ConfigError>([&] { parse_wan_vae_config(config, "config.json"); });
    EXPECT_NE(message.find(c.expected), std::string::npos) << c.key << ": " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  EXPECT_THROW(published_wan_vae_config("wan2.2-vae"), ConfigError);
}

TEST(WanVaeConfig, PublishedVaeBuildsShapesOnly) {
  EXPECT_EQ(published_wan_vae_config_names(), (std::vector<std::string>{"wan2.1-vae"}));
  const WanVaeConfig c = parse_wan_vae_config(published_wan_vae_config("wan2.1-vae"), "wan2.1-vae");
  EXPECT_EQ(c.dim, 96);
  EXPECT_EQ(c.z_dim, 16);
  EXPECT_EQ(c.latents_mean, wan21_latents_mean());
  parallel::ParamOptions options;
  options.shapes_only = true;
  auto model = std::make_shared<WanVAE>(c, options);
  EXPECT_EQ(parameter_count(*model), 126892531LL);
  const auto parameters = named_parameters(*model);
  EXPECT_EQ(parameters.size(), 194u);
  for (const auto& [name, p] : parameters) EXPECT_TRUE(p.is_meta()) << name;
  // Real layout: encoder 0,1 res / 2 down2d / 3,4 / 5 down3d / 6,7 / 8 down3d / 9,10; decoder 0-2 / 3
  // up3d / 4-6 / 7 up3d / 8-10 / 11 up2d / 12-14.
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, p] : parameters) shapes[name] = p.sizes().vec();
  EXPECT_EQ(shapes["encoder.downsamples.5.time_conv.weight"], (std::vector<int64_t>{192, 192, 3, 1, 1}));
  EXPECT_EQ(shapes["encoder.downsamples.10.residual.6.weight"], (std::vector<int64_t>{384, 384, 3, 3, 3}));
  EXPECT_EQ(shapes["decoder.upsamples.3.time_conv.weight"], (std::vector<int64_t>{768, 384, 3, 1, 1}));
  EXPECT_EQ(shapes["decoder.upsamples.11.resample.1.weight"], (std::vector<int64_t>{96, 192, 3, 3}));
  EXPECT_EQ(shapes["decoder.upsamples.14.residual.6.weight"], (std::vector<int64_t>{96, 96, 3, 3, 3}));
  EXPECT_EQ(shapes.count("decoder.upsamples.15.residual.0.gamma"), 0u);
}

// Fewer levels compress the sides less (2^(levels - 1)), as upstream's code builds them: its decoder
// halves the input width of levels 1..3 by hand, which fits the upsample before each for 2 to 4 levels.
// The expected shapes are read off upstream's Encoder3d / Decoder3d for dim 8, num_res_blocks 1.
TEST(WanVaeConfig, TwoOrThreeLevelsBuildAndRoundTrip) {
  at::NoGradGuard no_grad;
  struct Levels {
    std::vector<int64_t> dim_mult;
    std::vector<bool> temporal;
    int64_t spatial, latent_frames;
    std::map<std::string, std::vector<int64_t>> shapes;
  };
  const std::vector<Levels> cases = {
      {{1, 2, 2},
       {true, true},
       4,
       2,
       {{"encoder.downsamples.2.shortcut.weight", {16, 8, 1, 1, 1}},
        {"encoder.downsamples.3.time_conv.weight", {16, 16, 3, 1, 1}},
        {"encoder.downsamples.4.residual.6.weight", {16, 16, 3, 3, 3}},
        {"encoder.head.2.weight", {8, 16, 3, 3, 3}},
        {"decoder.conv1.weight", {16, 4, 3, 3, 3}},
        {"decoder.upsamples.2.resample.1.weight", {8, 16, 3, 3}},
        {"decoder.upsamples.3.shortcut.weight", {16, 8, 1, 1, 1}},
        {"decoder.upsamples.5.time_conv.weight", {32, 16, 3, 1, 1}},
        {"decoder.upsamples.6.residual.2.weight", {8, 8, 3, 3, 3}},
        {"decoder.upsamples.7.residual.6.weight", {8, 8, 3, 3, 3}},
        {"decoder.head.2.weight", {3, 8, 3, 3, 3}}}},
      {{1, 2},
       {false},
       2,
       5,
       {{"encoder.downsamples.1.resample.1.weight", {8, 8, 3, 3}},
        {"encoder.downsamples.2.shortcut.weight", {16, 8, 1, 1, 1}},
        {"decoder.conv1.weight", {16, 4, 3, 3, 3}},
        {"decoder.upsamples.2.resample.1.weight", {8, 16, 3, 3}},
        {"decoder.upsamples.4.residual.6.weight", {8, 8, 3, 3, 3}},
        {"decoder.head.2.weight", {3, 8, 3, 3, 3}}}},
  };
  for (const auto& l : cases) {
    const std::string what = fmt::format("dim_mult [{}]", fmt::join(l.dim_mult, ", "));
    nlohmann::json json = fixture_config_json();
    json["dim_mult"] = l.dim_mult;
    json["temperal_downsample"] = l.temporal;
    const WanVaeConfig c = parse_wan_vae_config(json, "config.json");
    EXPECT_EQ(c.spatial_factor(), l.spatial) << what;
    EXPECT_EQ(c.latent_frames(5), l.latent_frames) << what;
    auto model = std::make_shared<WanVAE>(c);
    init_wan_vae_parameters(*model, 3);
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const auto& [name, p] : named_parameters(*model)) shapes[name] = p.sizes().vec();
    for (const auto& [name, shape] : l.shapes) EXPECT_EQ(shapes[name], shape) << what << " " << name;
    // Past the encoder's last level, nothing.
    EXPECT_EQ(shapes.count(fmt::format("encoder.downsamples.{}.residual.0.gamma", 2 * l.dim_mult.size() - 1)),
              0u)
        << what;

    const at::Tensor video = at::rand({2, 3, 5, 16, 16}) * 2 - 1;
    const VaeEncoding chunked = model->encode(video), whole = model->encode(video, false);
    const std::vector<int64_t> latent = {2, kZ, l.latent_frames, 16 / l.spatial, 16 / l.spatial};
    EXPECT_EQ(chunked.mu.sizes().vec(), latent) << what;
    EXPECT_LE(max_abs_diff(what + " mu chunked vs whole", chunked.mu, whole.mu), kRegrouped);
    const at::Tensor decoded = model->decode(chunked.mu), decoded_whole = model->decode(chunked.mu, false);
    EXPECT_EQ(decoded.sizes(), video.sizes()) << what;
    EXPECT_LE(max_abs_diff(what + " decoded chunked vs whole", decoded, decoded_whole), kRegrouped);
  }
}

class WanVaeTiny : public ::testing::Test {
 protected:
  void SetUp() override { model = loaded_model(); }
  std::shared_ptr<WanVAE> model;
  at::NoGradGuard no_grad;
};

TEST_F(WanVaeTiny, ParameterNamesAndShapesMatchUpstream) {
  std::ifstream in(kDir + "/state_dict.txt");
  std::vector<std::string> expected, actual;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) expected.push_back(line);  // "name [d0, d1, ...]", upstream's module order
  ASSERT_EQ(expected.size(), 146u);
  for (const auto& [name, p] : named_parameters(*model))
    actual.push_back(fmt::format("{} [{}]", name, fmt::join(p.sizes(), ", ")));
  EXPECT_EQ(actual, expected);
  EXPECT_EQ(model->hf_config()["torch_dtype"], "float32");
  EXPECT_EQ(model->hf_config()["latents_std"], nlohmann::json::array({1.0, 1.0, 1.0, 1.0}));
  std::vector<std::string> layers;
  for (const auto& layer : model->layers()) layers.push_back(layer->name());
  EXPECT_EQ(layers, (std::vector<std::string>{"encoder", "conv1", "conv2", "decoder"}));
}

// The training layers (task vae) are the one-pass encode and decode: with no noise in the context the
// sample is mu, and the layers end in upstream's mu, log_var and decoded video.
TEST_F(WanVaeTiny, LayersGiveUpstreamsPosteriorAndReconstruction) {
  for (const auto& c : kCases) {
    WanVaeContext context;
    context.video = read_f32(c.name + "_video.bin", video_shape(c.frames));
    const core::Carry carry = core::run_layers(model->layers(), {}, context);
    const auto lat = latent_shape(c.latent_frames);
    EXPECT_LT(max_abs_diff(c.name + " layers mu", carry.get("mu"), read_f32(c.name + "_mu.bin", lat)),
              kTolerance);
    EXPECT_LT(max_abs_diff(c.name + " layers log_var", carry.get("log_var"),
                           read_f32(c.name + "_log_var.bin", lat)),
              kTolerance);
    EXPECT_LT(max_abs_diff(c.name + " layers decoded", carry.get("hidden"),
                           read_f32(c.name + "_decoded_raw.bin", video_shape(c.frames))),
              kTolerance);
    // With noise, the sample is mu + exp(log_var / 2) noise, decoded.
    context.noise = at::ones(lat);
    const core::Carry sampled = core::run_layers(model->layers(), {}, context);
    const at::Tensor expected = model->decode(carry.get("mu") + (0.5 * carry.get("log_var")).exp(), false);
    EXPECT_LT(max_abs_diff(c.name + " layers sampled", sampled.get("hidden"), expected), kRegrouped);
  }
}

TEST_F(WanVaeTiny, EncodeMatchesUpstream) {
  for (const auto& c : kCases) {
    const at::Tensor video = read_f32(c.name + "_video.bin", video_shape(c.frames));
    const auto lat = latent_shape(c.latent_frames);
    std::vector<int64_t> enc_shape = lat;
    enc_shape[1] = 2 * kZ;
    std::map<bool, std::pair<VaeEncoding, WanVaeTrace>> results;
    for (bool chunked : {true, false}) {
      const std::string mode = chunked ? "chunked" : "whole";
      WanVaeTrace trace;
      const VaeEncoding e = model->encode(video, chunked, &trace);
      EXPECT_LE(max_abs_diff(c.name + " enc_out " + mode, trace.encoder_output,
                             read_f32(c.name + "_enc_out.bin", enc_shape)),
                kTolerance);
      EXPECT_LE(max_abs_diff(c.name + " mu " + mode, e.mu, read_f32(c.name + "_mu.bin", lat)), kTolerance);
      EXPECT_LE(max_abs_diff(c.name + " log_var " + mode, e.log_var, read_f32(c.name + "_log_var.bin", lat)),
                kTolerance);
      results[chunked] = {e, trace};
    }
    EXPECT_LE(max_abs_diff(c.name + " enc_out chunked vs whole", results[true].second.encoder_output,
                           results[false].second.encoder_output),
              kRegrouped);
    EXPECT_LE(max_abs_diff(c.name + " mu chunked vs whole", results[true].first.mu, results[false].first.mu),
              kRegrouped);
  }
}

TEST_F(WanVaeTiny, DecodeMatchesUpstream) {
  for (const auto& c : kCases) {
    const at::Tensor mu = read_f32(c.name + "_mu.bin", latent_shape(c.latent_frames));
    std::map<bool, at::Tensor> decoded;
    for (bool chunked : {true, false}) {
      const std::string mode = chunked ? "chunked" : "whole";
      WanVaeTrace trace;
      const at::Tensor raw = model->decode(mu, chunked, &trace);
      EXPECT_LE(max_abs_diff(c.name + " dec_conv2_out " + mode, trace.decoder_input,
                             read_f32(c.name + "_dec_conv2_out.bin", latent_shape(c.latent_frames))),
                kTolerance);
      EXPECT_LE(max_abs_diff(c.name + " decoded_raw " + mode, raw,
                             read_f32(c.name + "_decoded_raw.bin", video_shape(c.frames))),
                kTolerance);
      EXPECT_LE(max_abs_diff(c.name + " decoded " + mode, raw.clamp(-1, 1),
                             read_f32(c.name + "_decoded.bin", video_shape(c.frames))),
                kTolerance);
      decoded[chunked] = raw;
    }
    EXPECT_LE(max_abs_diff(c.name + " decoded chunked vs whole", decoded[true], decoded[false]), kRegrouped);

    // The streaming form hands over frame 0, then 4 frames per further latent frame, which together
    // are the chunked decode.
    std::vector<at::Tensor> chunks;
    model->decode_chunks(mu, [&](const at::Tensor& frames) { chunks.push_back(frames); });
    ASSERT_EQ(chunks.size(), static_cast<size_t>(c.latent_frames));
    EXPECT_EQ(chunks[0].size(2), 1);
    for (size_t i = 1; i < chunks.size(); ++i) EXPECT_EQ(chunks[i].size(2), 4);
    EXPECT_TRUE(at::equal(at::cat(chunks, 2), decoded[true]));
  }
}

// Upstream encodes frame 0 and then whole chunks of 4: frames past 1 + 4k are dropped.
TEST_F(WanVaeTiny, FramesPastTheLastWholeChunkAreDropped) {
  const at::Tensor video = read_f32("t5_video.bin", video_shape(5));
  for (bool chunked : {true, false}) {
    const VaeEncoding five = model->encode(video, chunked);
    for (int64_t extra : {1, 3}) {
      const at::Tensor longer = at::cat({video, at::rand({1, 3, extra, kSize, kSize}) * 2 - 1}, 2);
      const VaeEncoding e = model->encode(longer, chunked);
      EXPECT_EQ(e.mu.sizes(), five.mu.sizes()) << 5 + extra;
      EXPECT_TRUE(at::equal(e.mu, five.mu)) << 5 + extra << " frames, chunked " << chunked;
      EXPECT_TRUE(at::equal(e.log_var, five.log_var)) << 5 + extra;
    }
  }
}

// Two clips in one batch give what each gives alone (frames are reshuffled with the batch for the
// per-frame attention and convolutions).
TEST_F(WanVaeTiny, BatchRowsAreIndependent) {
  const at::Tensor a = read_f32("t9_video.bin", video_shape(9));
  const at::Tensor b = a.flip(3) * -0.5;
  const at::Tensor both = at::cat({a, b}, 0);
  for (bool chunked : {true, false}) {
    const VaeEncoding e = model->encode(both, chunked);
    EXPECT_LE(max_abs_diff("batch row 0 mu", e.mu.narrow(0, 0, 1), model->encode(a, chunked).mu), kRegrouped);
    EXPECT_LE(max_abs_diff("batch row 1 mu", e.mu.narrow(0, 1, 1), model->encode(b, chunked).mu), kRegrouped);
    const at::Tensor decoded = model->decode(e.mu, chunked);
    EXPECT_LE(max_abs_diff("batch row 1 decoded", decoded.narrow(0, 1, 1),
                           model->decode(e.mu.narrow(0, 1, 1), chunked)),
              kRegrouped);
  }
}

// The cache makes any split of a clip into chunks give the one-pass result, not only upstream's.
TEST_F(WanVaeTiny, AnyChunkingGivesTheWholePass) {
  auto run = [](const auto& module, const at::Tensor& x, const std::vector<int64_t>& chunks) {
    CausalCache cache;
    std::vector<at::Tensor> outputs;
    int64_t begin = 0;
    for (int64_t n : chunks) {
      outputs.push_back(module->forward(x.narrow(2, begin, n), &cache));
      begin += n;
    }
    EXPECT_EQ(begin, x.size(2));
    return at::cat(outputs, 2);
  };
  const at::Tensor x16 = at::randn({2, 16, 9, 8, 8});
  // A residual block (two causal 3^3 convs with a shortcut) and a temporal downsample (9 -> 5 frames).
  for (const auto& module : {model->encoder->downsamples[4], model->encoder->downsamples[3]}) {
    const at::Tensor whole = module->forward(x16, nullptr);
    for (const auto& chunks :
         std::vector<std::vector<int64_t>>{{1, 4, 4}, {1, 2, 2, 2, 2}, {1, 8}, {3, 1, 5}, {9}})
      EXPECT_LE(
          max_abs_diff(fmt::format("chunks [{}]", fmt::join(chunks, ",")), run(module, x16, chunks), whole),
          kRegrouped);
  }
  // A temporal upsample (3 -> 5 frames), frame 0 never in a window.
  const auto& up3d = model->decoder->upsamples[2];
  const at::Tensor x32 = at::randn({1, 32, 3, 4, 4});
  const at::Tensor whole = up3d->forward(x32, nullptr);
  EXPECT_EQ(whole.sizes(), (std::vector<int64_t>{1, 16, 5, 8, 8}));
  for (const auto& chunks : std::vector<std::vector<int64_t>>{{1, 1, 1}, {1, 2}, {2, 1}})
    EXPECT_LE(
        max_abs_diff(fmt::format("up3d chunks [{}]", fmt::join(chunks, ",")), run(up3d, x32, chunks), whole),
        kRegrouped);
  // Frame 0 is in no time-conv window: changing it changes output frame 0 only (the spatial part is
  // per frame).
  at::Tensor changed = x32.clone();
  changed.narrow(2, 0, 1).fill_(3.0);
  const at::Tensor moved = up3d->forward(changed, nullptr);
  EXPECT_TRUE(at::equal(moved.narrow(2, 1, 4), whole.narrow(2, 1, 4)));
}

// A bfloat16 VAE runs and stays near the float32 one.
TEST_F(WanVaeTiny, RunsInBfloat16) {
  parallel::ParamOptions options;
  options.dtype = at::kBFloat16;
  auto half = std::make_shared<WanVAE>(fixture_config(), options);
  load_parameters(*half, kDir);
  const at::Tensor video = read_f32("t9_video.bin", video_shape(9));
  const VaeEncoding e = half->encode(video);
  EXPECT_EQ(e.mu.scalar_type(), at::kBFloat16);
  EXPECT_LE(max_abs_diff("bfloat16 mu", e.mu, read_f32("t9_mu.bin", latent_shape(3))), 0.1);
  const at::Tensor decoded = half->decode(read_f32("t9_mu.bin", latent_shape(3)));
  // bfloat16 keeps 8 bits of mantissa through the decoder's ~20 convolutions; how its rounding adds up
  // depends on the CPU's kernels (0.128 on an AVX2-only AMD EPYC): within 15% of the largest value.
  const at::Tensor reference = read_f32("t9_decoded_raw.bin", video_shape(9));
  EXPECT_LE(max_abs_diff("bfloat16 decoded_raw", decoded, reference),
            0.15 * reference.abs().max().item<double>());
  EXPECT_EQ(half->hf_config()["torch_dtype"], "bfloat16");
}

TEST_F(WanVaeTiny, RefusesWhatItCannotRun) {
  struct Refusal {
    at::Tensor input;
    bool encode;
    std::string expected;
  };
  const std::vector<Refusal> cases = {
      {at::zeros({1, 4, 5, 32, 32}), true,
       "Wan VAE encode: expected a video [B, 3, T >= 1, H, W], got [1, 4, 5, 32, 32]"},
      {at::zeros({3, 5, 32, 32}), true, "expected a video [B, 3, T >= 1, H, W], got [3, 5, 32, 32]"},
      {at::zeros({1, 3, 0, 32, 32}), true, "got [1, 3, 0, 32, 32]"},
      {at::zeros({1, 3, 5, 36, 32}), true, "height and width must be positive multiples of 8, got 36x32"},
      {at::zeros({1, 16, 2, 4, 4}), false,
       "Wan VAE decode: expected latents [B, 4, T >= 1, h, w], got [1, 16, 2, 4, 4]"},
  };
  for (const auto& c : cases) {
    const std::string message = message_of<ModelError>([&] {
      if (c.encode)
        model->encode(c.input);
      else
        model->decode(c.input);
    });
    EXPECT_NE(message.find(c.expected), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  parallel::ParamOptions doubles;
  doubles.dtype = at::kDouble;
  EXPECT_NE(message_of<ModelError>([&] {
              std::make_shared<WanVAE>(fixture_config(), doubles);
            }).find("float32 or bfloat16, not Double"),
            std::string::npos);
}

TEST(WanVaeLatents, NormalizeAndDenormalizeAreInverse) {
  nlohmann::json config = fixture_config_json();
  config["latents_mean"] = {0.5, -1.0, 2.0, 0.25};
  config["latents_std"] = {2.0, 0.5, 1.5, 3.0};
  parallel::ParamOptions options;
  options.shapes_only = true;  // the scale needs no weights
  const auto vae = std::make_shared<WanVAE>(parse_wan_vae_config(config, "config.json"), options);
  const WanVAE& model = *vae;
  const at::Tensor mu = at::randn({2, kZ, 3, 4, 4});
  const at::Tensor normalized = model.normalize_latents(mu);
  const at::Tensor mean = at::tensor(std::vector<float>{0.5F, -1.0F, 2.0F, 0.25F}).view({1, kZ, 1, 1, 1});
  const at::Tensor stdev = at::tensor(std::vector<float>{2.0F, 0.5F, 1.5F, 3.0F}).view({1, kZ, 1, 1, 1});
  EXPECT_LE(max_abs_diff("normalize", normalized, (mu - mean) / stdev), 1e-6);
  EXPECT_LE(max_abs_diff("denormalize(normalize)", model.denormalize_latents(normalized), mu), 1e-6);
  EXPECT_LE(
      max_abs_diff("normalize(denormalize)", model.normalize_latents(model.denormalize_latents(mu)), mu),
      1e-6);
  // Channel 1 of the normalised latents: (mu + 1) / 0.5.
  EXPECT_LE(max_abs_diff("normalize channel 1", normalized.select(1, 1), (mu.select(1, 1) + 1.0) * 2.0),
            1e-6);
  EXPECT_THROW(model.normalize_latents(at::zeros({1, 16, 1, 4, 4})), ModelError);
}

TEST(WanVaeLatents, ReparameterizeDrawsFromThePosterior) {
  VaeEncoding e{at::randn({1, kZ, 2, 4, 4}), at::randn({1, kZ, 2, 4, 4}) * 3};
  EXPECT_TRUE(at::equal(WanVAE::reparameterize(e, at::zeros_like(e.mu)), e.mu));
  const at::Tensor noise = at::randn_like(e.mu);
  EXPECT_LE(max_abs_diff("reparameterize", WanVAE::reparameterize(e, noise),
                         e.mu + at::exp(0.5 * e.log_var) * noise),
            1e-6);
  e.log_var.fill_(50.0);  // clamped to 20 first
  EXPECT_LE(max_abs_diff("reparameterize clamp", WanVAE::reparameterize(e, at::ones_like(e.mu)),
                         e.mu + std::exp(10.0)),
            1e-2);
  EXPECT_THROW(WanVAE::reparameterize(e, at::zeros({1, kZ, 1, 4, 4})), ModelError);
}

TEST(WanVaeInit, DependsOnSeedAndNameOnly) {
  at::NoGradGuard no_grad;
  const WanVaeConfig c = fixture_config();
  auto a_model = std::make_shared<WanVAE>(c), b_model = std::make_shared<WanVAE>(c);
  WanVAE &a = *a_model, &b = *b_model;
  init_wan_vae_parameters(a, 7);
  init_wan_vae_parameters(b, 7);
  WanVaeConfig deeper = c;
  deeper.num_res_blocks = 2;
  auto other_model = std::make_shared<WanVAE>(deeper), reseeded_model = std::make_shared<WanVAE>(c);
  WanVAE &other = *other_model, &reseeded = *reseeded_model;
  init_wan_vae_parameters(other, 7);
  init_wan_vae_parameters(reseeded, 8);
  std::map<std::string, at::Tensor> other_parameters;
  for (const auto& [name, p] : named_parameters(other)) other_parameters[name] = p;
  const auto pa = named_parameters(a), pb = named_parameters(b), pr = named_parameters(reseeded);
  int64_t shared = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    const auto& [name, p] = pa[i];
    EXPECT_TRUE(at::equal(p, pb[i].second)) << name;
    // A parameter of the same name in another architecture gets the same values where its module
    // has the same shape (a bias's bound is its weight's fan-in).
    const std::string weight_name = name.substr(0, name.rfind('.')) + ".weight";
    const auto it = other_parameters.find(name), other_weight = other_parameters.find(weight_name);
    const auto own_weight =
        std::find_if(pa.begin(), pa.end(), [&](const auto& e) { return e.first == weight_name; });
    if (it != other_parameters.end() && it->second.sizes() == p.sizes() &&
        (own_weight == pa.end() || (other_weight != other_parameters.end() &&
                                    other_weight->second.sizes() == own_weight->second.sizes()))) {
      EXPECT_TRUE(at::equal(p, it->second)) << name;
      ++shared;
    }
    const bool gamma = name.size() > 6 && name.compare(name.size() - 6, 6, ".gamma") == 0;
    const bool proj = name.find(".proj.weight") != std::string::npos;
    if (gamma) {
      EXPECT_TRUE(at::equal(p, at::ones_like(p))) << name;
    } else if (proj) {
      EXPECT_TRUE(at::equal(p, at::zeros_like(p))) << name;
    } else {
      EXPECT_FALSE(at::equal(p, pr[i].second)) << name;
      // Uniform in +-1/sqrt(fan_in), fan_in of the weight of the same module.
      const std::string path = name.substr(0, name.rfind('.'));
      const at::Tensor& weight = std::find_if(pa.begin(), pa.end(), [&](const auto& e) {
                                   return e.first == path + ".weight";
                                 })->second;
      const double bound = 1.0 / std::sqrt(static_cast<double>(weight.numel() / weight.size(0)));
      EXPECT_LE(p.abs().max().item<double>(), bound) << name;
      if (p.numel() >= 32) {
        EXPECT_GT(p.abs().max().item<double>(), 0.5 * bound) << name;
      }
    }
  }
  EXPECT_GT(shared, 20);  // encoder.conv1, the middles, heads, conv1/conv2, ...
  // A freshly initialised VAE runs: the attention blocks are the identity, everything finite.
  const at::Tensor video = read_f32("t5_video.bin", video_shape(5));
  const VaeEncoding e = a.encode(video);
  EXPECT_TRUE(at::isfinite(e.mu).all().item<bool>());
  EXPECT_TRUE(at::isfinite(a.decode(e.mu)).all().item<bool>());
}

}  // namespace
}  // namespace loom::models
