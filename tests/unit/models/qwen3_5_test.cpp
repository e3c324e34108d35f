// Qwen3.5's parts against transformers' (tests/fixtures/qwen3_5, made by its generators with the
// pinned transformers): the Gated DeltaNet layer on three packed samples (5, 1 and 70 tokens; the
// last crosses a 64-token chunk), outputs and every gradient, through the fused delta-rule kernel
// and the composite; and the convolution's sample boundaries.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../checkpoint/temp_dir.h"
#include "loom/checkpoint/safetensors.h"
#include "loom/data/chat_template.h"
#include "loom/data/image/decode.h"
#include "loom/data/tokenizer/tokenizer.h"
#include "loom/models/qwen3_5/attention.h"
#include "loom/models/qwen3_5/gated_deltanet.h"
#include "loom/models/qwen3_5/model.h"
#include "loom/models/qwen3_5/text.h"
#include "loom/models/qwen3_5/vision.h"
#include "loom/models/registry.h"
#include "loom/models/weights.h"

namespace loom::models::qwen3_5 {
namespace {

double relative_difference(const at::Tensor& got, const at::Tensor& expected) {
  EXPECT_EQ(got.sizes(), expected.sizes());
  return (got.to(at::kDouble) - expected.to(at::kDouble)).abs().max().item<double>() /
         expected.abs().max().item<double>();
}

TEST(Qwen35GatedDeltaNet, MatchesTransformersOnPackedSamples) {
  const checkpoint::SafetensorsReader f(std::string(LOOM_SOURCE_DIR) +
                                        "/tests/fixtures/qwen3_5/gated_deltanet.safetensors");
  const auto json = nlohmann::json::parse(f.metadata().at("config"));
  GatedDeltaNetConfig c;
  c.hidden_size = json["hidden_size"];
  c.num_key_heads = json["linear_num_key_heads"];
  c.num_value_heads = json["linear_num_value_heads"];
  c.key_head_dim = json["linear_key_head_dim"];
  c.value_head_dim = json["linear_value_head_dim"];
  c.conv_kernel = json["linear_conv_kernel_dim"];
  c.rms_norm_eps = json["rms_norm_eps"];
  std::vector<int64_t> cu{0};
  for (const int64_t n : nlohmann::json::parse(f.metadata().at("lengths"))) cu.push_back(cu.back() + n);
  for (const bool fused : {true, false}) {
    GatedDeltaNet layer(c, parallel::ParamOptions{});
    std::vector<std::string> names;
    {
      at::NoGradGuard no_grad;
      for (auto& item : layer.named_parameters()) {
        item.value().copy_(f.load(item.key()));
        names.push_back(item.key());
      }
    }
    ASSERT_EQ(names.size(), 9u);
    const at::Tensor x = f.load("x").requires_grad_(true);
    const at::Tensor out = layer.forward(x, cu, fused);
    EXPECT_LT(relative_difference(out, f.load("out")), 1e-5) << (fused ? "fused" : "composite");
    (out * f.load("dout")).sum().backward();
    EXPECT_LT(relative_difference(x.grad(), f.load("dx")), 1e-4) << (fused ? "fused" : "composite");
    for (auto& item : layer.named_parameters())
      EXPECT_LT(relative_difference(item.value().grad(), f.load("grad." + item.key())), 1e-4)
          << item.key() << (fused ? " fused" : " composite");
  }
}

TEST(Qwen35GatedAttention, MatchesTransformersOnPackedSamples) {
  const checkpoint::SafetensorsReader f(std::string(LOOM_SOURCE_DIR) +
                                        "/tests/fixtures/qwen3_5/attention.safetensors");
  const auto json = nlohmann::json::parse(f.metadata().at("config"));
  AttentionConfig c;
  c.hidden_size = json["hidden_size"];
  c.num_heads = json["num_attention_heads"];
  c.num_kv_heads = json["num_key_value_heads"];
  c.head_dim = json["head_dim"];
  c.rms_norm_eps = json["rms_norm_eps"];
  const auto& rope = json["rope_parameters"];
  RotaryConfig r;
  r.theta = rope["rope_theta"];
  r.rotary_dim = static_cast<int64_t>(c.head_dim * rope["partial_rotary_factor"].get<double>());
  r.sections = rope["mrope_section"].get<std::vector<int64_t>>();
  std::vector<int64_t> cu{0};
  for (const int64_t n : nlohmann::json::parse(f.metadata().at("lengths"))) cu.push_back(cu.back() + n);

  // Interleaved M-RoPE: the image tokens' height and width positions turn their own frequencies.
  const auto [cos, sin] = rotary_tables(f.load("positions"), r, at::kFloat);
  EXPECT_LT(relative_difference(cos, f.load("cos")), 1e-6);
  EXPECT_LT(relative_difference(sin, f.load("sin")), 1e-6);

  GatedAttention layer(c, parallel::ParamOptions{});
  {
    at::NoGradGuard no_grad;
    for (auto& item : layer.named_parameters()) item.value().copy_(f.load(item.key()));
  }
  ASSERT_EQ(layer.named_parameters().size(), 6u);
  const at::Tensor x = f.load("x").requires_grad_(true);
  const at::Tensor out = layer.forward(x, cos, sin, cu);
  EXPECT_LT(relative_difference(out, f.load("out")), 1e-5);
  (out * f.load("dout")).sum().backward();
  EXPECT_LT(relative_difference(x.grad(), f.load("dx")), 1e-5);
  for (auto& item : layer.named_parameters())
    EXPECT_LT(relative_difference(item.value().grad(), f.load("grad." + item.key())), 1e-5) << item.key();
}

// The tiny language models' config as the fixture's metadata holds it (HF's text_config keys).
TextConfig text_config(const nlohmann::json& j) {
  TextConfig c;
  c.vocab_size = j["vocab_size"];
  c.hidden_size = j["hidden_size"];
  c.layer_types = j["layer_types"].get<std::vector<std::string>>();
  c.rms_norm_eps = j["rms_norm_eps"];
  c.attention = {c.hidden_size, j["num_attention_heads"], j["num_key_value_heads"], j["head_dim"], false,
                 c.rms_norm_eps};
  c.linear = {c.hidden_size,
              j["linear_num_key_heads"],
              j["linear_num_value_heads"],
              j["linear_key_head_dim"],
              j["linear_value_head_dim"],
              j["linear_conv_kernel_dim"],
              c.rms_norm_eps};
  const auto& rope = j["rope_parameters"];
  c.rotary = {rope["rope_theta"],
              static_cast<int64_t>(c.attention.head_dim * rope["partial_rotary_factor"].get<double>()),
              rope["mrope_section"].get<std::vector<int64_t>>()};
  if (j.contains("num_experts")) {
    c.num_experts = j["num_experts"];
    c.num_experts_per_tok = j["num_experts_per_tok"];
    c.moe_intermediate_size = j["moe_intermediate_size"];
    c.shared_expert_intermediate_size = j["shared_expert_intermediate_size"];
  } else {
    c.intermediate_size = j["intermediate_size"];
  }
  return c;
}

// Dense and MoE language models of 4 layers (linear, full, linear, full) on packed samples of 9, 1
// and 70 tokens: logits, every weight's gradient, and (MoE) each layer's router logits and the
// load-balancing loss over them.
TEST(Qwen35TextModel, MatchesTransformersOnPackedSamples) {
  for (const char* name : {"text_dense", "text_moe"}) {
    const checkpoint::SafetensorsReader f(std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/qwen3_5/" + name +
                                          ".safetensors");
    const TextConfig c = text_config(nlohmann::json::parse(f.metadata().at("config")));
    std::vector<int64_t> cu{0};
    std::vector<at::Tensor> positions;
    for (const int64_t n : nlohmann::json::parse(f.metadata().at("lengths"))) {
      cu.push_back(cu.back() + n);
      positions.push_back(at::arange(n, at::kLong));
    }
    const at::Tensor position_rows = at::cat(positions).expand({3, cu.back()});  // text: three equal rows
    TextModel model(c, parallel::ParamOptions{});
    auto lm_head = std::make_shared<parallel::ColumnParallelLinear>(c.hidden_size, c.vocab_size, false,
                                                                    parallel::ParamOptions{});
    {
      at::NoGradGuard no_grad;
      for (auto& item : model.named_parameters()) item.value().copy_(f.load(item.key()));
      lm_head->weight.copy_(f.load("lm_head.weight"));
    }
    std::vector<at::Tensor> routers;
    const at::Tensor hidden = model.forward(f.load("input_ids"), position_rows, cu, true, &routers);
    const at::Tensor logits = at::matmul(hidden, lm_head->weight.t());
    EXPECT_LT((logits - f.load("logits")).abs().max().item<double>(), 1e-4) << name;
    at::Tensor loss = (logits * f.load("dlogits")).sum();
    if (c.moe()) {
      ASSERT_EQ(routers.size(), 4u);
      for (size_t l = 0; l < routers.size(); ++l)
        EXPECT_LT(relative_difference(routers[l], f.load("router_logits." + std::to_string(l))), 1e-5) << l;
      const at::Tensor aux = load_balancing_loss(routers, c.num_experts_per_tok);
      EXPECT_NEAR(aux.item<double>(), f.load("aux_loss").item<double>(), 1e-6);
    }
    loss.backward();
    size_t checked = 0;
    for (auto& item : model.named_parameters()) {
      EXPECT_LT(relative_difference(item.value().grad(), f.load("grad." + item.key())), 1e-4)
          << name << " " << item.key();
      ++checked;
    }
    EXPECT_LT(relative_difference(lm_head->weight.grad(), f.load("grad.lm_head.weight")), 1e-4) << name;
    EXPECT_EQ(checked + 1, (f.names().size() - (c.moe() ? 8 : 3)) / 2) << name;  // every weight
  }
}

// The vision tower on a 4 x 6 image (the 8 x 8 position table shrunk), a 12 x 10 one (grown) and a
// video of two temporal patches (each its own attention segment): merged output and every gradient.
TEST(Qwen35VisionModel, MatchesTransformers) {
  const checkpoint::SafetensorsReader f(std::string(LOOM_SOURCE_DIR) +
                                        "/tests/fixtures/qwen3_5/vision.safetensors");
  const auto j = nlohmann::json::parse(f.metadata().at("config"));
  VisionConfig c;
  c.depth = j["depth"];
  c.hidden_size = j["hidden_size"];
  c.intermediate_size = j["intermediate_size"];
  c.num_heads = j["num_heads"];
  c.in_channels = j["in_channels"];
  c.patch_size = j["patch_size"];
  c.spatial_merge_size = j["spatial_merge_size"];
  c.temporal_patch_size = j["temporal_patch_size"];
  c.out_hidden_size = j["out_hidden_size"];
  c.num_position_embeddings = j["num_position_embeddings"];
  VisionModel tower(c, parallel::ParamOptions{});
  size_t count = 0;
  {
    at::NoGradGuard no_grad;
    for (auto& item : tower.named_parameters()) {
      item.value().copy_(f.load(item.key()));
      ++count;
    }
  }
  EXPECT_EQ(count, (f.names().size() - 4) / 2);  // every weight of the fixture
  const at::Tensor out = tower.forward(f.load("pixel_values"), f.load("grid_thw"));
  EXPECT_LT(relative_difference(out, f.load("out")), 1e-5);
  (out * f.load("dout")).sum().backward();
  for (auto& item : tower.named_parameters())
    EXPECT_LT(relative_difference(item.value().grad(), f.load("grad." + item.key())), 1e-4) << item.key();
}

// The whole models, dense and MoE, loaded by their family from directories as transformers writes
// them (the experts fused, an MTP tensor left unread): an image prompt, and a prompt with a video of
// two temporal patches (each its own block after a timestamp) and an image: position ids exactly
// transformers' get_rope_index's, logits within 1e-4.
TEST(Qwen35Model, LoadsAndMatchesTransformers) {
  for (const char* variant : {"dense", "moe"}) {
    const std::string dir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/qwen3_5/" + variant;
    const NamedModel named = find_model(dir);
    ASSERT_NE(named.family, nullptr);
    EXPECT_EQ(named.family->name, std::string(variant) == "dense" ? "qwen3_5" : "qwen3_5_moe");
    const auto loaded = load_model(named, dir);
    const auto& model = dynamic_cast<const qwen3_5::ForConditionalGeneration&>(*loaded);
    const checkpoint::SafetensorsReader f(dir + "/expected.safetensors");
    for (const std::string sample : {"image", "video"}) {
      VisionLanguageInputs in;
      in.input_ids = f.load(sample + ".input_ids");
      in.pixel_values = f.load(sample + ".pixel_values");
      in.image_grid_thw = f.load(sample + ".image_grid_thw");
      if (f.contains(sample + ".pixel_values_videos")) {
        in.pixel_values_videos = f.load(sample + ".pixel_values_videos");
        in.video_grid_thw = f.load(sample + ".video_grid_thw");
      }
      EXPECT_TRUE(model.position_ids(in).equal(f.load(sample + ".position_ids"))) << variant << " " << sample;
      at::NoGradGuard no_grad;
      const at::Tensor logits = model.forward(in);
      EXPECT_LT((logits - f.load(sample + ".logits")).abs().max().item<double>(), 1e-4)
          << variant << " " << sample;
    }
  }
}

// The MoE checkpoint with its experts one by one (mlp.experts.<e>.{gate,up,down}_proj.weight, as
// transformers' save_pretrained writes them) loads to the same model: the same logits.
TEST(Qwen35Model, ExpertsSavedOneByOneLoadAlike) {
  const std::string dir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/qwen3_5/moe";
  const checkpoint::testing::TempDir scratch;
  const std::string split = scratch.path().string();
  std::filesystem::copy_file(dir + "/config.json", split + "/config.json");
  const checkpoint::SafetensorsReader fused(dir + "/model.safetensors");
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const std::string& name : fused.names()) {
    const at::Tensor t = fused.load(name);
    const auto at = name.find("mlp.experts.");
    if (at == std::string::npos) {
      tensors.emplace_back(name, t);
      continue;
    }
    const std::string base = name.substr(0, at) + "mlp.experts.";
    for (int64_t e = 0; e < t.size(0); ++e) {
      const std::string expert = base + std::to_string(e) + ".";
      if (name.find("gate_up_proj") != std::string::npos) {
        const int64_t half = t.size(1) / 2;
        tensors.emplace_back(expert + "gate_proj.weight", t[e].narrow(0, 0, half).contiguous());
        tensors.emplace_back(expert + "up_proj.weight", t[e].narrow(0, half, half).contiguous());
      } else {
        tensors.emplace_back(expert + "down_proj.weight", t[e].contiguous());
      }
    }
  }
  checkpoint::save_safetensors(split + "/model.safetensors", tensors);
  const auto a = load_model(find_model(dir), dir), b = load_model(find_model(split), split);
  const checkpoint::SafetensorsReader f(dir + "/expected.safetensors");
  VisionLanguageInputs in;
  in.input_ids = f.load("image.input_ids");
  in.pixel_values = f.load("image.pixel_values");
  in.image_grid_thw = f.load("image.image_grid_thw");
  at::NoGradGuard no_grad;
  const auto& vlm = [](const core::Model& m) -> const VisionLanguageModel& {
    return dynamic_cast<const VisionLanguageModel&>(m);
  };
  EXPECT_TRUE(vlm(*a).forward(in).equal(vlm(*b).forward(in)));
}

// With output_router_logits (as transformers adds it to the loss), the MoE model's last layer leaves
// router_aux_loss_coef times transformers' load-balancing loss over every layer's routing.
// Generation (loom chat, loom generate, the evaluation): the image prompt and a shorter text prompt
// left-padded into one batch, prefilled, then stepped with the tokens transformers picked. Each
// step's logits match transformers' greedy generation of each prompt alone, and their argmax is its
// token (tests/fixtures/qwen3_5/make_generate.py).
TEST(Qwen35Model, GeneratesAsTransformers) {
  for (const char* variant : {"dense", "moe"}) {
    const std::string dir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/qwen3_5/" + variant;
    const auto loaded = load_model(find_model(dir), dir);
    const auto& model = dynamic_cast<const ForConditionalGeneration&>(*loaded);
    const checkpoint::SafetensorsReader f(dir + "/generate.safetensors");
    const at::Tensor a = f.load("a.input_ids"), b = f.load("b.input_ids");
    const int64_t pad = a.size(1) - b.size(1);
    VisionLanguageInputs prompts;
    prompts.input_ids = at::cat({a, at::cat({at::zeros({1, pad}, at::kLong), b}, 1)});
    prompts.attention_mask = at::ones({2, a.size(1)}, at::kLong);
    prompts.attention_mask[1].narrow(0, 0, pad).zero_();
    prompts.pixel_values = f.load("a.pixel_values");
    prompts.image_grid_thw = f.load("a.image_grid_thw");
    const at::Tensor tokens = at::stack({f.load("a.tokens"), f.load("b.tokens")}, 1);    // (steps, 2)
    const at::Tensor expected = at::stack({f.load("a.logits"), f.load("b.logits")}, 1);  // (steps, 2, vocab)
    at::NoGradGuard no_grad;
    const auto decoder = model.decoder();
    at::Tensor logits = decoder->prefill(prompts);
    for (int64_t s = 0; s < tokens.size(0); ++s) {
      EXPECT_LT((logits - expected[s]).abs().max().item<double>(), 1e-4) << variant << " step " << s;
      EXPECT_TRUE(logits.argmax(-1).equal(tokens[s])) << variant << " step " << s;
      if (s + 1 < tokens.size(0)) logits = decoder->step(tokens[s]);
    }
  }
}

TEST(Qwen35Model, RouterLossMatchesTransformers) {
  const std::string dir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/qwen3_5/moe";
  NamedModel named = find_model(dir);
  named.hf["text_config"]["output_router_logits"] = true;
  const auto loaded = load_model(named, dir);
  const auto& model = dynamic_cast<const qwen3_5::ForConditionalGeneration&>(*loaded);
  const checkpoint::SafetensorsReader f(dir + "/expected.safetensors");
  VisionLanguageInputs in;
  in.input_ids = f.load("video.input_ids");
  in.pixel_values = f.load("video.pixel_values");
  in.image_grid_thw = f.load("video.image_grid_thw");
  in.pixel_values_videos = f.load("video.pixel_values_videos");
  in.video_grid_thw = f.load("video.video_grid_thw");
  at::NoGradGuard no_grad;
  const core::Carry carry = core::run_layers(model.layers(), {}, *model.context(in));
  const double coefficient = model.config.text.router_aux_loss_coef;
  EXPECT_NEAR(carry.get("aux_loss").item<double>() / coefficient, f.load("video.aux_loss").item<double>(),
              1e-5);
  // Without it, no auxiliary loss, as transformers.
  const auto plain = load_model(find_model(dir), dir);
  EXPECT_FALSE(core::run_layers(plain->layers(), {},
                                *dynamic_cast<const qwen3_5::ForConditionalGeneration&>(*plain).context(in))
                   .has("aux_loss"));
}

// The MoE fixture built with the job's routing choices (training.moe_*), its weights loaded.
std::shared_ptr<core::Model> routed_moe(double capacity_factor, double z_loss, double expert_bias_rate) {
  const std::string dir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/qwen3_5/moe";
  const NamedModel named = find_model(dir);
  BuildOptions options;
  options.moe_capacity_factor = capacity_factor;
  options.moe_z_loss = z_loss;
  options.moe_expert_bias_rate = expert_bias_rate;
  std::shared_ptr<core::Model> model = named.family->build(named.hf, named.source, options);
  named.family->init(*model, 1);
  named.family->load(*model, dir);  // the fixture has no expert bias: it stays zero
  return model;
}

// 40 text tokens (no image): the language model alone sees what the layers see.
VisionLanguageInputs text_only() {
  VisionLanguageInputs in;
  in.input_ids = at::arange(3, 283, 7, at::kLong).view({1, -1});
  return in;
}

// The router z-loss: the mean over the tokens of logsumexp(router logits)^2, summed over the layers,
// times its coefficient; the report's rows are each layer's picks.
TEST(Qwen35Model, RouterZLossIsEachLayersMeanSquaredLogsumexpSummed) {
  const auto loaded = routed_moe(0.0, 0.01, 0.0);
  const auto& model = dynamic_cast<const ForConditionalGeneration&>(*loaded);
  const VisionLanguageInputs in = text_only();
  const int64_t tokens = in.input_ids.size(1);
  at::NoGradGuard no_grad;
  const core::Carry carry = core::run_layers(model.layers(), {}, *model.context(in));
  std::vector<at::Tensor> routers;
  model.language_model->forward(in.input_ids, model.position_ids(in).squeeze(1), {0, tokens}, true, &routers);
  ASSERT_EQ(routers.size(), 4u);
  double expected = 0.0;
  for (const at::Tensor& r : routers)
    expected += at::logsumexp(r.to(at::kDouble), -1).pow(2).mean().item<double>();
  EXPECT_NEAR(carry.get("aux_loss").item<double>(), 0.01 * expected, 1e-6 * expected);
  const at::Tensor report = carry.get("expert_tokens");  // (layers, experts + 4)
  ASSERT_EQ(report.sizes(), (std::vector<int64_t>{4, 8}));
  for (int64_t l = 0; l < 4; ++l) {
    const at::Tensor picks = at::one_hot(std::get<1>(at::softmax(routers[l], -1, at::kFloat).topk(2, -1)), 4)
                                 .sum({0, 1})
                                 .to(at::kFloat);
    EXPECT_TRUE(report[l].narrow(0, 0, 4).equal(picks)) << l;
    EXPECT_EQ(report[l][4].item<float>(), 0.0F) << l;  // dropless
  }
}

// A capacity of ceil(0.6 * 40 * 2 / 4) = 12 picks an expert: each layer drops its experts' picks
// beyond 12, and the tokens go on without them (another output than dropless).
TEST(Qwen35Model, ACapacityDropsThePicksBeyondIt) {
  const auto dropless = routed_moe(0.0, 0.0, 0.0), capped = routed_moe(0.6, 0.0, 0.0);
  const VisionLanguageInputs in = text_only();
  at::NoGradGuard no_grad;
  const auto run = [&in](const core::Model& m) {
    const auto& model = dynamic_cast<const ForConditionalGeneration&>(m);
    return core::run_layers(model.layers(), {}, *model.context(in));
  };
  const core::Carry all = run(*dropless), some = run(*capped);
  const at::Tensor report = some.get("expert_tokens");
  // The first layer routes alike in both (the same input); its drops are the picks over 12.
  const at::Tensor first = all.get("expert_tokens")[0].narrow(0, 0, 4);
  EXPECT_TRUE(report[0].narrow(0, 0, 4).equal(first));
  EXPECT_EQ(report[0][4].item<float>(), (first - 12).clamp_min(0).sum().item<float>());
  double dropped = 0;
  for (int64_t l = 0; l < 4; ++l) {
    EXPECT_EQ(report[l][4].item<float>(), (report[l].narrow(0, 0, 4) - 12).clamp_min(0).sum().item<float>())
        << l;
    dropped += report[l][4].item<double>();
  }
  ASSERT_GT(dropped, 0);
  EXPECT_FALSE(at::allclose(all.get("hidden"), some.get("hidden")));
}

// The auxiliary-loss-free expert bias: zero at first (the plain routing), moved after each step by
// the rate towards the experts with fewer picks than the mean; a large bias on an expert sends every
// token there.
TEST(Qwen35Model, ExpertBiasStartsAtZeroAndMovesTowardsBalance) {
  const auto plain = routed_moe(0.0, 0.0, 0.0), biased = routed_moe(0.0, 0.0, 0.1);
  auto& model = dynamic_cast<ForConditionalGeneration&>(*biased);
  const VisionLanguageInputs in = text_only();
  const auto run = [&in](const core::Model& m) {
    at::NoGradGuard no_grad;
    const auto& vlm = dynamic_cast<const ForConditionalGeneration&>(m);
    return core::run_layers(vlm.layers(), {}, *vlm.context(in));
  };
  EXPECT_TRUE(run(*plain).get("hidden").equal(run(*biased).get("hidden")));
  const auto params = named_parameters(model.module());
  EXPECT_TRUE(std::any_of(params.begin(), params.end(), [](const auto& p) {
    return p.first == "model.language_model.layers.0.mlp.expert_bias" && !p.second.requires_grad();
  }));
  // Picks 30, 10, 20, 20 (mean 20) in every layer: + for expert 1, - for expert 0, none for 2 and 3.
  model.end_step(at::tensor({30.0, 10.0, 20.0, 20.0}, at::kDouble).repeat({4, 1}));
  model.end_step(at::tensor({30.0, 10.0, 20.0, 20.0}, at::kDouble).repeat({4, 1}));
  for (const auto& layer : model.language_model->layers)
    EXPECT_TRUE(at::allclose(layer->moe->expert_bias, at::tensor({-0.2F, 0.2F, 0.0F, 0.0F})))
        << layer->name();
  model.language_model->layers[0]->moe->expert_bias.copy_(at::tensor({0.0F, 0.0F, 5.0F, 0.0F}));
  const at::Tensor report = run(model).get("expert_tokens");
  EXPECT_EQ(report[0][2].item<float>(), static_cast<float>(in.input_ids.size(1)));  // every token picks 2
}

// The image processor with the directory's settings gives transformers' pixel values and grid.
TEST(Qwen35Model, ProcessorMatchesTransformers) {
  const std::string dir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/qwen3_5/dense";
  const NamedModel named = find_model(dir);
  const auto processor = make_processor(named.family->name, named.hf, named.source, dir);
  const data::VisionInput image = processor->process(data::decode_image_file(dir + "/image.png"));
  const checkpoint::SafetensorsReader f(dir + "/expected.safetensors");
  EXPECT_TRUE(image.grid_thw == (std::array<int64_t, 3>{1, 4, 6}));
  EXPECT_LT((image.pixel_values - f.load("image.pixel_values")).abs().max().item<double>(), 1e-5);
  EXPECT_EQ(processor->default_system(), "");
  EXPECT_TRUE(processor->takes_videos());
}

// Videos as transformers' Qwen3VLVideoProcessor and Qwen3VLProcessor make them
// (tests/fixtures/qwen3_5/make_video.py): for clips of 4, 5 (the last frame repeated) and 2 frames,
// under bounds that keep, shrink and grow them, the pixel values within 1e-5 and the grid exactly;
// a user turn "<video>What moves?" holds transformers' ids (each temporal patch after its
// "<t.t seconds>", a block of its own). The clip bounds default to the video processor's.
TEST(Qwen35Processor, VideosMatchTransformers) {
  const std::string dir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/qwen3_5/dense";
  const NamedModel named = find_model(dir);
  const checkpoint::SafetensorsReader f(std::string(LOOM_SOURCE_DIR) +
                                        "/tests/fixtures/qwen3_5/video.safetensors");
  const auto defaults = make_processor(named.family->name, named.hf, named.source, dir);
  const nlohmann::ordered_json config = defaults->video_preprocessor_config();
  EXPECT_EQ(config["video_processor_type"], "Qwen3VLVideoProcessor");
  EXPECT_EQ(config["size"]["shortest_edge"].get<int64_t>(), f.load("defaults")[0].item<int64_t>());
  EXPECT_EQ(config["size"]["longest_edge"].get<int64_t>(), f.load("defaults")[1].item<int64_t>());
  const auto tokenizer = data::load_tokenizer(std::string(LOOM_SOURCE_DIR) +
                                              "/tests/fixtures/conversations/chatml_bpe_tokenizer.json");
  for (const std::string clip : {"four", "odd", "two"}) {
    auto processor = make_processor(named.family->name, named.hf, named.source, dir);
    const at::Tensor bounds = f.load(clip + ".bounds");
    processor->set_video_pixel_bounds(bounds[0].item<int64_t>(), bounds[1].item<int64_t>());
    const at::Tensor pixels = f.load(clip + ".frames").contiguous();  // (n, H, W, 3) uint8
    std::vector<data::Image> frames;
    for (int64_t i = 0; i < pixels.size(0); ++i) {
      data::Image frame{static_cast<int>(pixels.size(1)), static_cast<int>(pixels.size(2)), {}};
      const uint8_t* data = pixels[i].contiguous().data_ptr<uint8_t>();
      frame.rgb.assign(data, data + pixels[i].numel());
      frames.push_back(std::move(frame));
    }
    const data::VisionInput video = processor->process_video(frames, f.load(clip + ".fps").item<double>());
    const at::Tensor grid = f.load(clip + ".video_grid_thw")[0];
    EXPECT_TRUE(video.grid_thw == (std::array<int64_t, 3>{grid[0].item<int64_t>(), grid[1].item<int64_t>(),
                                                          grid[2].item<int64_t>()}))
        << clip;
    ASSERT_EQ(video.pixel_values.sizes(), f.load(clip + ".pixel_values_videos").sizes()) << clip;
    EXPECT_LT((video.pixel_values - f.load(clip + ".pixel_values_videos")).abs().max().item<double>(), 1e-5)
        << clip;
    data::ChatTemplateOptions options;
    options.processor = std::shared_ptr<const data::ImageProcessor>(processor.get(), [](auto*) {});
    const data::ChatTemplate chat(*tokenizer, options);
    data::Conversation conversation;
    conversation.messages = {{data::Role::user, "<video>What moves?"}, {data::Role::assistant, "a square"}};
    conversation.videos.resize(1);
    const std::vector<int64_t> ids = chat.apply(conversation, {}, {video}).input_ids;
    const at::Tensor expected_tensor = f.load(clip + ".input_ids");
    const std::vector<int64_t> expected(expected_tensor.data_ptr<int64_t>(),
                                        expected_tensor.data_ptr<int64_t>() + expected_tensor.numel());
    EXPECT_NE(std::search(ids.begin(), ids.end(), expected.begin(), expected.end()), ids.end())
        << clip << ": " << tokenizer->decode(ids);
  }
}

TEST(Qwen35GatedDeltaNet, ConvolutionStartsAfreshAtEachSample) {
  // Kernel 3 over samples of 2 and 3 rows: each output is the sum over the rows of its own sample
  // that the kernel reaches, weights (1, 10, 100) from the oldest row to the current one.
  const at::Tensor x = at::tensor({1.0, 2.0, 3.0, 4.0, 5.0}).view({5, 1});
  const at::Tensor weight = at::tensor({1.0, 10.0, 100.0}).view({1, 3});
  const at::Tensor out = causal_conv1d(x, weight, {0, 2, 5}).view({5});
  const std::vector<double> expected = {100, 210, 300, 430, 543};
  for (int64_t t = 0; t < 5; ++t) EXPECT_DOUBLE_EQ(out[t].item<double>(), expected[t]) << t;
}

}  // namespace
}  // namespace loom::models::qwen3_5
