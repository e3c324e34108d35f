// Loom's Wan2.1 DiT against outputs of the official Wan2.1 code on a tiny random model
// (tests/fixtures/wan-tiny, see its README): every intermediate the reference recorded, layer by
// layer; the forward pass against the layers; the diffusers layout; the rotary embedding at the
// table's last positions against float64; the published models' parameter counts; the config's
// refusals. The expected outputs are only compared against, never fed into the computation.
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "loom/checkpoint/safetensors.h"
#include "loom/models/wan/config.h"
#include "loom/models/wan/dit.h"
#include "loom/models/wan/layers.h"
#include "loom/models/wan/names.h"
#include "loom/models/wan/ops.h"
#include "loom/models/weights.h"
#include "loom/nn/fused.h"
#include "loom/util/errors.h"
#include "loom/util/filesystem.h"
#include "reference_fixture.h"

namespace loom::models {
namespace {

namespace fs = std::filesystem;

const std::string kDir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/wan-tiny/dit";
const testing::ReferenceFixture kFixture(kDir, "wan-tiny dit");
nlohmann::json read_json(const std::string& name) { return kFixture.json(name); }
at::Tensor read_f32(const std::string& name, at::IntArrayRef shape) { return kFixture.f32(name, shape); }
double max_abs_diff(const std::string& what, const at::Tensor& actual, const at::Tensor& expected) {
  return kFixture.max_abs_diff(what, actual, expected);
}
using testing::message_of;
// The README's: an independent float32 implementation reaches 2e-6; 2e-5 is "comfortable".
constexpr double kTolerance = 2e-5;
constexpr int64_t kDim = 64, kTokens = 48, kTextLen = 16, kTextDim = 48, kContextLen = 7;

std::string temp_dir() {
  std::string pattern = (fs::temp_directory_path() / "loom-wan-dit-test-XXXXXX").string();
  EXPECT_NE(::mkdtemp(pattern.data()), nullptr);
  return pattern;
}

std::shared_ptr<WanModel> loaded_model(const parallel::ParamOptions& options = {}) {
  auto model = std::make_shared<WanModel>(wan_config_from_dir(kDir), options);
  load_wan_parameters(*model, kDir);
  model->eval();
  return model;
}

// The fixture's inputs with a batch dimension: latents [1, 4, 3, 8, 8], t [1], text [1, 7, 48].
struct Inputs {
  at::Tensor latents = read_f32("x.bin", {1, 4, 3, 8, 8});
  at::Tensor timesteps = read_f32("t.bin", {1});
  at::Tensor text = read_f32("context.bin", {1, kContextLen, kTextDim});
};

// ---- config ----

TEST(WanConfig, ReadsTheFixtureConfig) {
  const WanConfig c = wan_config_from_dir(kDir);
  EXPECT_EQ(c.model_type, "t2v");
  EXPECT_EQ(c.patch_size, (std::array<int64_t, 3>{1, 2, 2}));
  EXPECT_EQ(c.text_len, kTextLen);
  EXPECT_EQ(c.in_dim, 4);
  EXPECT_EQ(c.dim, kDim);
  EXPECT_EQ(c.ffn_dim, 128);
  EXPECT_EQ(c.freq_dim, 32);
  EXPECT_EQ(c.text_dim, kTextDim);
  EXPECT_EQ(c.out_dim, 4);
  EXPECT_EQ(c.num_heads, 4);
  EXPECT_EQ(c.head_dim(), 16);
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.cross_attn_norm);
  EXPECT_EQ(c.eps, 1e-6);
  EXPECT_EQ(c.patch_out_width(), 16);

  // Written back with Wan's keys and read again as the same architecture.
  const nlohmann::json hf = to_hf_config(c);
  EXPECT_EQ(hf["_class_name"], "WanModel");
  EXPECT_EQ(hf["dim"], kDim);
  EXPECT_EQ(hf["window_size"], nlohmann::json::array({-1, -1}));
  EXPECT_FALSE(hf.contains("rope_max_seq_len"));
  const WanConfig again = parse_wan_config(hf, "written");
  EXPECT_EQ(to_hf_config(again), hf);
}

nlohmann::json diffusers_config(int64_t heads, int64_t head_dim, int64_t ffn, int64_t layers) {
  return {{"_class_name", "WanTransformer3DModel"},
          {"_diffusers_version", "0.33.0.dev0"},
          {"added_kv_proj_dim", nullptr},
          {"attention_head_dim", head_dim},
          {"cross_attn_norm", true},
          {"eps", 1e-6},
          {"ffn_dim", ffn},
          {"freq_dim", 256},
          {"image_dim", nullptr},
          {"in_channels", 16},
          {"num_attention_heads", heads},
          {"num_layers", layers},
          {"out_channels", 16},
          {"patch_size", {1, 2, 2}},
          {"qk_norm", "rms_norm_across_heads"},
          {"rope_max_seq_len", 1024},
          {"text_dim", 4096}};
}

TEST(WanConfig, ReadsDiffusersKeysAsTheSameArchitecture) {
  const WanConfig published = parse_wan_config(published_wan_config("wan2.1-t2v-1.3b"), "wan2.1-t2v-1.3b");
  const WanConfig diffusers =
      parse_wan_config(diffusers_config(12, 128, 8960, 30), "transformer/config.json");
  EXPECT_EQ(to_hf_config(diffusers), to_hf_config(published));
  EXPECT_EQ(diffusers.text_len, 512);
  // The diffusers keys are not carried into a Wan config.json.
  EXPECT_FALSE(to_hf_config(diffusers).contains("num_attention_heads"));
  nlohmann::json no_qk = diffusers_config(12, 128, 8960, 30);
  no_qk["qk_norm"] = nullptr;
  EXPECT_FALSE(parse_wan_config(no_qk, "x").qk_norm);
}

TEST(WanConfig, RefusesWhatItCannotRun) {
  struct Case {
    bool diffusers;
    const char* key;
    nlohmann::json value;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {false, "model_type", "i2v", "config.json: model_type: 'i2v' is not supported (valid: t2v"},
      {false,
       "window_size",
       {256, 256},
       "config.json: window_size: [256, 256] is not supported (valid: [-1, -1]"},
      {false, "window_size", {-1}, "config.json: window_size: expected a list of 2 integers, got [-1]"},
      {false, "num_heads", 5, "config.json: num_heads: 5 does not divide dim 64"},
      {false, "num_heads", 64, "config.json: num_heads: dim 64 / 64 heads = head_dim 1, which must be even"},
      {false, "num_heads", 0, "config.json: num_heads: must be positive, got 0"},
      {false, "dim", nullptr, "config.json: dim: missing required field"},
      {false, "ffn_dim", -3, "config.json: ffn_dim: must be positive, got -3"},
      {false, "text_len", 0, "config.json: text_len: must be positive, got 0"},
      {false, "freq_dim", 31, "config.json: freq_dim: must be even, got 31"},
      {false, "eps", 0.0, "config.json: eps: must be > 0, got 0"},
      {false, "patch_size", {1, 0, 2}, "config.json: patch_size: [1, 0, 2] must be positive"},
      {false, "qk_norm", "yes", "config.json: qk_norm: expected true or false, got \"yes\""},
      {false, "_class_name", "WanVACETransformer3DModel",
       "config.json: _class_name: 'WanVACETransformer3DModel' is not a Wan2.1 text-to-video DiT"},
      {true, "image_dim", 1280, "config.json: image_dim: 1280 is set: an image-to-video model"},
      {true, "qk_norm", "rms_norm",
       "config.json: qk_norm: 'rms_norm' is not supported (valid: rms_norm_across_heads"},
      {true, "attention_head_dim", 0, "config.json: attention_head_dim: must be positive, got 0"},
      {true, "num_layers", nullptr, "config.json: num_layers: missing required field"},
  };
  for (const auto& c : cases) {
    nlohmann::json hf = c.diffusers ? diffusers_config(4, 16, 128, 2) : read_json("config.json");
    if (c.value.is_null())
      hf.erase(c.key);
    else
      hf[c.key] = c.value;
    const std::string message = message_of<ConfigError>([&] { parse_wan_config(hf, "config.json"); });
    EXPECT_NE(message.find(c.expected), std::string::npos) << c.key << ": " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  EXPECT_THROW(published_wan_config("wan2.1-i2v-14b"), ConfigError);
}

TEST(WanConfig, PublishedModelsBuildShapesOnlyWithTheirParameterCounts) {
  for (auto [name, expected] : {std::pair<const char*, int64_t>{"wan2.1-t2v-1.3b", 1418996800LL},
                                {"wan2.1-t2v-14b", 14288491584LL}}) {
    const WanConfig c = parse_wan_config(published_wan_config(name), name);
    parallel::ParamOptions options;
    options.shapes_only = true;
    const auto model = std::make_shared<WanModel>(c, options);
    const int64_t count = parameter_count(*model);
    std::printf("  %s: %lld parameters\n", name, static_cast<long long>(count));
    EXPECT_EQ(count, expected) << name;
    const auto parameters = named_parameters(*model);
    EXPECT_EQ(parameters.size(), static_cast<size_t>(15 + 27 * c.num_layers)) << name;
    for (const auto& [n, p] : parameters) EXPECT_TRUE(p.is_meta()) << n;
    EXPECT_EQ(model->layers().size(), static_cast<size_t>(c.num_layers + 5));
  }
  EXPECT_EQ(published_wan_config_names(), (std::vector<std::string>{"wan2.1-t2v-1.3b", "wan2.1-t2v-14b"}));

  // Without the q/k norms and norm3: 4 + 2 fewer tensors of C per block.
  WanConfig plain = wan_config_from_dir(kDir);
  plain.qk_norm = false;
  plain.cross_attn_norm = false;
  parallel::ParamOptions options;
  options.shapes_only = true;
  EXPECT_EQ(parameter_count(*std::make_shared<WanModel>(wan_config_from_dir(kDir), options)), 142032);
  EXPECT_EQ(parameter_count(*std::make_shared<WanModel>(plain, options)), 142032 - 2 * 6 * kDim);
}

TEST(WanConfig, RefusesDtypesItDoesNotRun) {
  parallel::ParamOptions options;
  options.shapes_only = true;
  options.dtype = at::kHalf;
  const std::string message =
      message_of<ModelError>([&] { std::make_shared<WanModel>(wan_config_from_dir(kDir), options); });
  EXPECT_NE(message.find("Wan DiT runs in float32 or bfloat16, not Half"), std::string::npos) << message;
}

// ---- the tiny model against the reference ----

TEST(WanDiT, ParameterNamesShapesAndOrderMatchWan) {
  std::ifstream in(kDir + "/state_dict.txt");
  std::vector<std::string> expected;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) expected.push_back(line);  // "name [d0, d1, ...]"
  ASSERT_EQ(expected.size(), 69u);
  parallel::ParamOptions options;
  options.shapes_only = true;
  const auto model = std::make_shared<WanModel>(wan_config_from_dir(kDir), options);
  std::vector<std::string> actual;
  for (const auto& [n, p] : named_parameters(*model))
    actual.push_back(fmt::format("{} [{}]", n, fmt::join(p.sizes(), ", ")));
  EXPECT_EQ(actual, expected);
}

TEST(WanDiT, SinusoidMatchesTheReference) {
  const at::Tensor sinusoid = wan_sinusoid(32, read_f32("t.bin", {1}));
  EXPECT_LE(max_abs_diff("time_sinusoid", sinusoid, read_f32("time_sinusoid.bin", {1, 32})), kTolerance);
  // Against float64 written out here, at timesteps where float32 angles would be off by ~3e-5.
  const std::vector<double> times{0.0, 1.0, 637.0, 999.0, 1000.0};
  const at::Tensor actual = wan_sinusoid(256, at::tensor(times, at::kDouble));
  double worst = 0;
  for (size_t b = 0; b < times.size(); ++b)
    for (int64_t i = 0; i < 128; ++i) {
      const double angle = times[b] * std::pow(10000.0, -static_cast<double>(i) / 128.0);
      worst = std::max({worst, std::abs(actual[b][i].item<double>() - std::cos(angle)),
                        std::abs(actual[b][128 + i].item<double>() - std::sin(angle))});
    }
  std::printf("  sinusoid (256, t <= 1000) vs float64: max abs diff %.3g\n", worst);
  EXPECT_LE(worst, 1e-7);  // float32 rounding of the result only
}

TEST(WanDiT, LayersMatchEveryReferenceOutput) {
  at::NoGradGuard no_grad;
  const auto model = loaded_model();
  const Inputs in;
  const auto context = model->context(in.latents, in.timesteps, in.text);
  EXPECT_EQ(context->grid, (WanGrid{3, 4, 4}));
  const nlohmann::json io = read_json("io.json");
  EXPECT_EQ(io["grid_sizes"], nlohmann::json::array({3, 4, 4}));
  EXPECT_EQ(context->text.sizes(), (std::vector<int64_t>{1, kTextLen, kTextDim}));
  EXPECT_EQ(context->self_cu, (std::vector<int64_t>{0, kTokens}));

  const core::Layers layers = model->layers();
  std::vector<std::string> names;
  for (const auto& layer : layers) names.push_back(layer->name());
  EXPECT_EQ(names, (std::vector<std::string>{"time_embedding", "time_projection", "text_embedding",
                                             "patch_embedding", "blocks.0", "blocks.1", "head"}));
  for (size_t i = 0; i < layers.size(); ++i) EXPECT_EQ(layers[i]->block(), names[i].rfind("blocks.", 0) == 0);

  core::Carry carry;
  auto run = [&](size_t i) { carry = layers[i]->forward(std::move(carry), *context); };
  run(0);
  EXPECT_EQ(carry.get("time_embedding").scalar_type(), at::kFloat);
  EXPECT_LE(max_abs_diff("time_embedding_out", carry.get("time_embedding"),
                         read_f32("time_embedding_out.bin", {1, kDim})),
            kTolerance);
  run(1);
  EXPECT_EQ(carry.get("time_modulation").sizes(), (std::vector<int64_t>{1, 6, kDim}));
  EXPECT_LE(max_abs_diff("time_projection_out", carry.get("time_modulation"),
                         read_f32("time_projection_out.bin", {1, 6 * kDim}).view({1, 6, kDim})),
            kTolerance);
  run(2);
  EXPECT_LE(max_abs_diff("text_embedding_out", carry.get("context"),
                         read_f32("text_embedding_out.bin", {1, kTextLen, kDim})),
            kTolerance);
  run(3);
  const at::Tensor patches =
      read_f32("patch_embedding_out.bin", {1, kDim, 3, 4, 4}).flatten(2).transpose(1, 2);
  EXPECT_LE(max_abs_diff("patch_embedding_out", carry.get("hidden"), patches), kTolerance);
  run(4);
  EXPECT_LE(max_abs_diff("block0_out", carry.get("hidden"), read_f32("block0_out.bin", {1, kTokens, kDim})),
            kTolerance);
  run(5);
  EXPECT_LE(max_abs_diff("block1_out", carry.get("hidden"), read_f32("block1_out.bin", {1, kTokens, kDim})),
            kTolerance);
  run(6);
  EXPECT_EQ(carry.tensors().size(), 1u);  // the head drops the time embedding, modulation and context
  EXPECT_LE(max_abs_diff("head_out", carry.get("hidden"), read_f32("head_out.bin", {1, kTokens, 16})),
            kTolerance);
  const at::Tensor out = unpatchify(carry.get("hidden"), context->grid, model->config.patch_size, 4);
  EXPECT_LE(max_abs_diff("out", out, read_f32("out.bin", {4, 3, 8, 8}).unsqueeze(0)), kTolerance);
}

TEST(WanDiT, ForwardEqualsTheLayersAndBatchesSamples) {
  at::NoGradGuard no_grad;
  const auto model = loaded_model();
  const Inputs in;
  const at::Tensor out = model->forward(in.latents, in.timesteps, in.text);
  const auto context = model->context(in.latents, in.timesteps, in.text);
  const at::Tensor tokens = core::run_layers(model->layers(), {}, *context).get("hidden");
  EXPECT_TRUE(at::equal(out, unpatchify(tokens, context->grid, model->config.patch_size, 4)));
  // Zero rows past the prompt given or left out: the same input.
  EXPECT_TRUE(at::equal(out, model->forward(in.latents, in.timesteps, pad_text({in.text[0]}, kTextLen))));

  // Two samples of one batch: each as it is alone (another timestep and a shorter prompt in the second).
  const at::Tensor latents = at::cat({in.latents, in.latents.flip(-1) * 0.5});
  const at::Tensor timesteps = at::tensor({637.0F, 12.5F});
  const at::Tensor text = pad_text({in.text[0], in.text[0].narrow(0, 0, 3)}, kTextLen);
  const at::Tensor both = model->forward(latents, timesteps, text);
  EXPECT_LE(max_abs_diff("batch row 0 vs alone", both.narrow(0, 0, 1), out), 1e-5);
  const at::Tensor second =
      model->forward(latents.narrow(0, 1, 1), timesteps.narrow(0, 1, 1), text.narrow(0, 1, 1));
  EXPECT_LE(max_abs_diff("batch row 1 vs alone", both.narrow(0, 1, 1), second), 1e-5);
  EXPECT_GT((both[0] - both[1]).abs().max().item<double>(), 1e-2);

  EXPECT_EQ(model->hf_config()["torch_dtype"], "float32");
  EXPECT_EQ(model->hf_config()["_class_name"], "WanModel");
}

// 128 tokens or more take nn::segment_attention's flash kernel and the fused RMSNorm; the same result
// as the composite forms.
TEST(WanDiT, LongSequencesGiveTheCompositeResult) {
  at::NoGradGuard no_grad;
  const auto model = loaded_model();
  auto generator = at::make_generator<at::CPUGeneratorImpl>(11);
  const at::Tensor latents =
      at::randn({2, 4, 3, 16, 12}, generator, at::kFloat);  // grid 3 x 8 x 6 = 144 tokens
  const at::Tensor timesteps = at::tensor({999.0F, 3.0F});
  const at::Tensor text = at::randn({2, 9, kTextDim}, generator, at::kFloat);
  const bool was = nn::fused_kernels();
  nn::set_fused_kernels(true);
  const at::Tensor fused = model->forward(latents, timesteps, text);
  nn::set_fused_kernels(false);
  const at::Tensor composite = model->forward(latents, timesteps, text);
  nn::set_fused_kernels(was);
  EXPECT_EQ(fused.sizes(), (std::vector<int64_t>{2, 4, 3, 16, 12}));
  EXPECT_LE(max_abs_diff("144 tokens fused vs composite", fused, composite), 1e-5);
}

// Training runs backward through every layer: each parameter gets a finite, non-zero gradient.
TEST(WanDiT, BackwardReachesEveryParameter) {
  const auto model = loaded_model();
  model->train();
  const Inputs in;
  const auto context = model->context(in.latents, in.timesteps, in.text);
  const at::Tensor tokens = core::run_layers(model->layers(), {}, *context).get("hidden");
  const at::Tensor target =
      head_tokens(in.latents, model->config.patch_size);  // the layout a loss compares in
  (tokens - target).pow(2).sum().backward();
  for (const auto& [name, p] : named_parameters(*model)) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_TRUE(at::isfinite(p.grad()).all().item<bool>()) << name;
    EXPECT_GT(p.grad().abs().max().item<double>(), 0.0) << name;
  }
}

TEST(WanDiT, RefusesInputsItCannotRun) {
  const auto model = loaded_model();
  const Inputs in;
  std::string message =
      message_of<ModelError>([&] { model->context(in.latents.narrow(-1, 0, 7), in.timesteps, in.text); });
  EXPECT_NE(message.find("is not a multiple of the patch [1, 2, 2]"), std::string::npos) << message;
  message = message_of<ModelError>([&] {
    model->context(in.latents, in.timesteps, at::zeros({1, kTextLen + 1, kTextDim}));
  });
  EXPECT_NE(message.find("text must be [1, at most 16, 48], got [1, 17, 48]"), std::string::npos) << message;
  message = message_of<ModelError>([&] { model->context(in.latents, at::zeros({2}), in.text); });
  EXPECT_NE(message.find("timesteps must be [1], got [2]"), std::string::npos) << message;
  // 1025 frames: beyond the 1024 positions of the rotary tables.
  message = message_of<ModelError>([&] {
    model->context(at::zeros({1, 4, 1025, 2, 2}), in.timesteps, in.text);
  });
  EXPECT_NE(message.find("position 1024 is outside the table of 1024 positions"), std::string::npos)
      << message;
}

// ---- the diffusers layout ----

TEST(WanNames, MapEveryParameterBothWays) {
  parallel::ParamOptions options;
  options.shapes_only = true;
  const auto model = std::make_shared<WanModel>(wan_config_from_dir(kDir), options);
  std::set<std::string> diffusers_names;
  for (const auto& [name, p] : named_parameters(*model)) {
    const std::string diffusers = diffusers_name_from_wan(name);
    EXPECT_EQ(wan_name_from_diffusers(diffusers), name);
    diffusers_names.insert(diffusers);
  }
  EXPECT_EQ(diffusers_names.size(), 69u);
  for (const char* name :
       {"condition_embedder.time_embedder.linear_1.weight", "condition_embedder.time_proj.bias",
        "condition_embedder.text_embedder.linear_2.bias", "scale_shift_table", "proj_out.weight",
        "patch_embedding.weight", "blocks.1.scale_shift_table", "blocks.0.attn1.to_out.0.weight",
        "blocks.0.attn2.norm_k.weight", "blocks.1.norm2.bias", "blocks.0.ffn.net.0.proj.weight",
        "blocks.1.ffn.net.2.bias"})
    EXPECT_EQ(diffusers_names.count(name), 1u) << name;
  EXPECT_EQ(wan_name_from_diffusers("blocks.0.norm2.weight"),
            "blocks.0.norm3.weight");  // the cross-attention norm
  EXPECT_EQ(wan_name_from_diffusers("scale_shift_table"), "head.modulation");
  EXPECT_TRUE(is_diffusers_layout({"patch_embedding.weight", "condition_embedder.time_proj.weight"}));
  EXPECT_FALSE(is_diffusers_layout({"patch_embedding.weight", "time_projection.1.weight"}));
  for (const char* foreign :
       {"blocks.0.attn2.add_k_proj.weight", "condition_embedder.image_embedder.norm1.weight",
        "blocks.0.norm1.weight", "blocks.x.attn1.to_q.weight", "proj_out.scale"})
    EXPECT_THROW(wan_name_from_diffusers(foreign), CheckpointError) << foreign;
  EXPECT_THROW(diffusers_name_from_wan("blocks.0.norm2.weight"), CheckpointError);
}

TEST(WanNames, TheDiffusersLayoutLoadsBitIdentically) {
  at::NoGradGuard no_grad;
  const std::string dir = temp_dir();
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  {
    const checkpoint::SafetensorsReader reader(kDir + "/model.safetensors");
    for (const auto& name : reader.names())
      tensors.emplace_back(diffusers_name_from_wan(name), reader.load(name));
  }
  ASSERT_EQ(tensors.size(), 69u);
  checkpoint::save_safetensors(dir + "/diffusion_pytorch_model.safetensors", tensors);
  nlohmann::json hf = diffusers_config(4, 16, 128, 2);
  hf["in_channels"] = 4;
  hf["out_channels"] = 4;
  hf["text_dim"] = kTextDim;
  hf["freq_dim"] = 32;
  hf["text_len"] = kTextLen;  // not a diffusers key: the tiny model pads prompts to 16 rows, not 512
  std::ofstream(dir + "/config.json") << hf.dump(2);

  const WanConfig config = wan_config_from_dir(dir);
  EXPECT_EQ(to_hf_config(config), to_hf_config(wan_config_from_dir(kDir)));
  auto from_diffusers = std::make_shared<WanModel>(config);
  load_wan_parameters(*from_diffusers, dir);
  const auto reference = loaded_model();
  const auto expected = named_parameters(*reference);
  const auto actual = named_parameters(*from_diffusers);
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i)
    EXPECT_TRUE(at::equal(actual[i].second, expected[i].second)) << actual[i].first;
  const Inputs in;
  EXPECT_TRUE(at::equal(from_diffusers->forward(in.latents, in.timesteps, in.text),
                        reference->forward(in.latents, in.timesteps, in.text)));

  // Loom's own loader reads the Wan layout the same way.
  auto plain = std::make_shared<WanModel>(wan_config_from_dir(kDir));
  load_parameters(*plain, kDir);
  for (const auto& [name, p] : named_parameters(*plain))
    EXPECT_TRUE(at::equal(p, reference->named_parameters()[name])) << name;

  // A diffusers file with an image-to-video tensor, and one without a tensor the model has.
  tensors.emplace_back("blocks.0.attn2.add_k_proj.weight", at::zeros({kDim, kDim}));
  checkpoint::save_safetensors(dir + "/diffusion_pytorch_model.safetensors", tensors);
  std::string message = message_of<CheckpointError>([&] { load_wan_parameters(*from_diffusers, dir); });
  EXPECT_NE(message.find("tensor 'blocks.0.attn2.add_k_proj.weight' does not belong"), std::string::npos)
      << message;
  tensors.pop_back();
  tensors.erase(std::find_if(tensors.begin(), tensors.end(),
                             [](const auto& t) { return t.first == "blocks.1.norm2.bias"; }));
  checkpoint::save_safetensors(dir + "/diffusion_pytorch_model.safetensors", tensors);
  message = message_of<CheckpointError>([&] { load_wan_parameters(*from_diffusers, dir); });
  EXPECT_NE(message.find("tensor 'blocks.1.norm2.bias' is missing"), std::string::npos) << message;
  std::error_code error;
  remove_tree(dir, error);
}

// ---- rotary embedding, sinusoid, token layouts ----

// Every position of the table (0..1023) on each axis, against rotations written out in float64.
TEST(WanRope, MatchesFloat64AtEveryPositionOfTheTable) {
  EXPECT_EQ(wan_rope_pairs(128), (std::array<int64_t, 3>{22, 21, 21}));
  EXPECT_EQ(wan_rope_pairs(16), (std::array<int64_t, 3>{4, 2, 2}));
  const int64_t length = 1024;
  std::vector<int64_t> where;
  for (int64_t p = 0; p < length; ++p) {
    where.push_back(p);
    where.push_back(length - 1 - p);
    where.push_back((p * 389) % length);
  }
  const at::Tensor positions = at::tensor(where, at::kLong).view({length, 3});
  for (int64_t head_dim : {16, 128}) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(7);
    const at::Tensor x = at::randn({1, length, 2, head_dim}, generator, at::kFloat);
    const auto [cos, sin] = wan_rope_tables(positions, head_dim);
    const at::Tensor rotated = apply_rotary_interleaved(x, cos, sin);
    const auto pairs = wan_rope_pairs(head_dim);
    at::Tensor expected = at::empty({1, length, 2, head_dim}, at::kDouble);
    auto xa = x.accessor<float, 4>();
    auto ea = expected.accessor<double, 4>();
    for (int64_t t = 0; t < length; ++t)
      for (int64_t h = 0; h < 2; ++h) {
        int64_t pair = 0;
        for (int64_t axis = 0; axis < 3; ++axis)
          for (int64_t j = 0; j < pairs[axis]; ++j, ++pair) {
            const double angle = static_cast<double>(where[t * 3 + axis]) *
                                 std::pow(10000.0, -2.0 * j / (2.0 * static_cast<double>(pairs[axis])));
            const double a = xa[0][t][h][2 * pair], b = xa[0][t][h][2 * pair + 1];
            ea[0][t][h][2 * pair] = a * std::cos(angle) - b * std::sin(angle);
            ea[0][t][h][2 * pair + 1] = a * std::sin(angle) + b * std::cos(angle);
          }
      }
    EXPECT_LE(max_abs_diff(fmt::format("rope d={} pos<=1023", head_dim), rotated, expected), 2e-6);
  }
}

TEST(WanOps, TokenLayoutsMatchTheConvolutionAndInvert) {
  at::NoGradGuard no_grad;
  const auto model = loaded_model();
  const Inputs in;
  // The patch embedding as a linear over patch rows is Wan's Conv3d with kernel = stride = patch.
  const at::Tensor conv =
      at::conv3d(in.latents, model->patch_embedding->weight, model->patch_embedding->bias, {1, 2, 2});
  EXPECT_LE(max_abs_diff("patch rows vs conv3d", model->patch_embedding->forward(in.latents),
                         conv.flatten(2).transpose(1, 2)),
            1e-5);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor video = at::randn({2, 5, 4, 6, 8}, generator, at::kFloat);
  const std::array<int64_t, 3> patch{2, 3, 2};
  EXPECT_TRUE(at::equal(unpatchify(head_tokens(video, patch), latent_grid(video, patch), patch, 5), video));
  // Channel innermost: token (0, 0, 1), element ((p ph + q) pw + r) C + c is video[c, p, q, 2 + r].
  const at::Tensor tokens = head_tokens(video, patch);
  EXPECT_EQ(tokens[1][1][((1 * 3 + 2) * 2 + 1) * 5 + 3].item<float>(), video[1][3][1][2][3].item<float>());

  // The cross-attention in query chunks (3 queries at a time here) gives the one-pass result.
  const at::Tensor q = at::randn({2, 10, 3, 8}, generator, at::kFloat);
  const at::Tensor k = at::randn({2, 5, 3, 8}, generator, at::kFloat),
                   v = at::randn({2, 5, 3, 8}, generator, at::kFloat);
  const at::Tensor whole = cross_attention(q, k, v);
  EXPECT_LE(max_abs_diff("cross attention chunked", cross_attention(q, k, v, 2 * 3 * 5 * 3), whole), 1e-6);
  const at::Tensor scores = at::einsum("bqhd,bkhd->bhqk", {q, k}) / std::sqrt(8.0);
  EXPECT_LE(max_abs_diff("cross attention vs einsum", whole,
                         at::einsum("bhqk,bkhd->bqhd", {at::softmax(scores, -1), v})),
            1e-6);
}

// ---- initialisation and bfloat16 ----

TEST(WanInit, FollowsWansRulesFromSeedAndNameAlone) {
  const WanConfig config = wan_config_from_dir(kDir);
  auto model = std::make_shared<WanModel>(config);
  init_wan_parameters(*model, 1234);
  auto p = model->named_parameters();
  EXPECT_EQ(p["head.head.weight"].abs().max().item<float>(), 0.0F);
  EXPECT_EQ(p["blocks.0.self_attn.q.bias"].abs().max().item<float>(), 0.0F);
  EXPECT_EQ(p["blocks.1.norm3.bias"].abs().max().item<float>(), 0.0F);
  EXPECT_TRUE(at::equal(p["blocks.1.norm3.weight"], at::ones({kDim})));
  EXPECT_TRUE(at::equal(p["blocks.0.cross_attn.norm_k.weight"], at::ones({kDim})));
  // Xavier-uniform bounds: sqrt(6 / (fan_in + fan_out)).
  EXPECT_LE(p["blocks.0.ffn.0.weight"].abs().max().item<double>(), std::sqrt(6.0 / (64 + 128)));
  EXPECT_GT(p["blocks.0.ffn.0.weight"].abs().max().item<double>(), 0.9 * std::sqrt(6.0 / (64 + 128)));
  EXPECT_LE(p["patch_embedding.weight"].abs().max().item<double>(), std::sqrt(6.0 / (16 + 64)));
  EXPECT_GT(p["patch_embedding.weight"].abs().max().item<double>(), 0.9 * std::sqrt(6.0 / (16 + 64)));
  EXPECT_NEAR(p["text_embedding.0.weight"].std().item<double>(), 0.02, 0.002);
  EXPECT_NEAR(p["time_embedding.2.weight"].std().item<double>(), 0.02, 0.002);
  EXPECT_NEAR(p["blocks.1.modulation"].std().item<double>(), 1.0 / 8.0, 0.02);
  EXPECT_NEAR(p["head.modulation"].std().item<double>(), 1.0 / 8.0, 0.03);

  // The same seed gives the same tensors in a model of another depth; another seed other tensors.
  WanConfig deeper = config;
  deeper.num_layers = 3;
  auto other = std::make_shared<WanModel>(deeper);
  init_wan_parameters(*other, 1234);
  for (const auto& [name, value] : named_parameters(*model))
    EXPECT_TRUE(at::equal(value, other->named_parameters()[name])) << name;
  init_wan_parameters(*other, 1235);
  parallel::ParamOptions shapes;
  shapes.shapes_only = true;
  init_wan_parameters(*std::make_shared<WanModel>(config, shapes), 1);  // meta tensors are left alone
  EXPECT_FALSE(
      at::equal(p["blocks.0.self_attn.q.weight"], other->named_parameters()["blocks.0.self_attn.q.weight"]));
}

TEST(WanDiT, RunsInBfloat16WithFloat32Islands) {
  at::NoGradGuard no_grad;
  parallel::ParamOptions options;
  options.dtype = at::kBFloat16;
  const auto half = loaded_model(options);
  const auto full = loaded_model();
  EXPECT_EQ(half->blocks[0]->self_attn->q->weight.scalar_type(), at::kBFloat16);
  const Inputs in;
  const auto context = half->context(in.latents, in.timesteps, in.text);
  core::Carry carry;
  const core::Layers layers = half->layers();
  for (size_t i = 0; i < 5; ++i) carry = layers[i]->forward(std::move(carry), *context);
  EXPECT_EQ(carry.get("time_embedding").scalar_type(), at::kFloat);
  EXPECT_EQ(carry.get("time_modulation").scalar_type(), at::kFloat);
  EXPECT_EQ(carry.get("context").scalar_type(), at::kBFloat16);
  EXPECT_EQ(carry.get("hidden").scalar_type(), at::kFloat);
  const at::Tensor out = half->forward(in.latents, in.timesteps, in.text);
  EXPECT_EQ(out.scalar_type(), at::kFloat);
  const at::Tensor reference = full->forward(in.latents, in.timesteps, in.text);
  const double scale = reference.abs().max().item<double>();
  std::printf("  fp32 out max abs %.3g\n", scale);
  const double diff = max_abs_diff("bf16 out vs fp32 out", out, reference);
  EXPECT_LE(diff, 0.05 * scale);
  EXPECT_EQ(half->hf_config()["torch_dtype"], "bfloat16");
}

}  // namespace
}  // namespace loom::models
