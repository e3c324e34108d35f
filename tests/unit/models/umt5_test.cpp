// Loom's umT5 encoder against outputs of HuggingFace transformers' own UMT5EncoderModel on a tiny
// random model (tests/fixtures/umt5-tiny, see its README): every intermediate at every position, the
// padded ones included (only they catch a rounded instead of truncated logarithmic bucket). The
// expected outputs are only compared against, never fed into the computation.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "loom/checkpoint/safetensors.h"
#include "loom/models/umt5/config.h"
#include "loom/models/umt5/model.h"
#include "loom/models/weights.h"
#include "loom/util/errors.h"
#include "loom/util/filesystem.h"
#include "reference_fixture.h"

namespace loom::models {
namespace {

namespace fs = std::filesystem;

const std::string kDir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/umt5-tiny";
const testing::ReferenceFixture kFixture(kDir, "umt5-tiny");
nlohmann::json read_json(const std::string& name) { return kFixture.json(name); }
at::Tensor read_f32(const std::string& name, at::IntArrayRef shape) { return kFixture.f32(name, shape); }
double max_abs_diff(const std::string& what, const at::Tensor& actual, const at::Tensor& expected) {
  return kFixture.max_abs_diff(what, actual, expected);
}
using testing::message_of;
constexpr double kTolerance = 1e-5;  // the README's: an independent float32 implementation reaches 5e-6
constexpr int64_t kBatch = 2, kLength = 12, kModel = 32, kHeads = 4;

at::Tensor ids_tensor(const nlohmann::json& rows) {
  std::vector<int64_t> flat;
  for (const auto& row : rows)
    for (const auto& v : row) flat.push_back(v.get<int64_t>());
  return at::tensor(flat, at::kLong).view({static_cast<int64_t>(rows.size()), -1});
}

std::shared_ptr<UMT5EncoderModel> loaded_model() {
  auto model = std::make_shared<UMT5EncoderModel>(umt5_config_from_dir(kDir));
  load_parameters(*model, kDir);
  model->eval();
  return model;
}

TEST(UMT5Config, ReadsTheFixtureConfig) {
  const UMT5Config c = umt5_config_from_dir(kDir);
  EXPECT_EQ(c.vocab_size, 300);
  EXPECT_EQ(c.d_model, 32);
  EXPECT_EQ(c.d_kv, 8);
  EXPECT_EQ(c.d_ff, 64);
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.num_heads, 4);
  EXPECT_EQ(c.inner_dim(), 32);
  EXPECT_EQ(c.relative_attention_num_buckets, 32);
  EXPECT_EQ(c.relative_attention_max_distance, 128);
  EXPECT_EQ(c.layer_norm_epsilon, 1e-6);
  EXPECT_EQ(c.feed_forward_proj, "gated-gelu");
  EXPECT_EQ(c.pad_token_id, 0);
  EXPECT_EQ(c.eos_token_id, 1);

  // Written back with the fields Loom does not use, and read again as the same architecture.
  const nlohmann::json hf = to_hf_config(c);
  EXPECT_EQ(hf["tokenizer_class"], "T5Tokenizer");
  EXPECT_EQ(hf["architectures"], nlohmann::json::array({"UMT5EncoderModel"}));
  EXPECT_EQ(hf["model_type"], "umt5");
  const UMT5Config again = parse_umt5_config(hf, "written");
  EXPECT_EQ(again.d_model, c.d_model);
  EXPECT_EQ(again.layer_norm_epsilon, c.layer_norm_epsilon);
  EXPECT_EQ(again.relative_attention_max_distance, c.relative_attention_max_distance);
}

TEST(UMT5Config, RefusesWhatItCannotRun) {
  struct Case {
    const char* key;
    nlohmann::json value;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"feed_forward_proj", "relu",
       "config.json: feed_forward_proj: 'relu' is not supported (valid: gated-gelu)"},
      {"layer_norm_epsilon", 0.0, "config.json: layer_norm_epsilon: must be > 0, got 0"},
      {"layer_norm_epsilon", -1e-6, "config.json: layer_norm_epsilon: must be > 0"},
      {"model_type", "t5", "config.json: model_type: 't5' is not umt5"},
      {"d_model", nullptr, "config.json: d_model: missing required field"},
      {"num_heads", 0, "config.json: num_heads: must be positive, got 0"},
      {"relative_attention_num_buckets", 2,
       "config.json: relative_attention_num_buckets: must be at least 4"},
      {"eos_token_id", 300, "config.json: eos_token_id: 300 is outside the vocabulary [0, 300)"},
  };
  for (const auto& c : cases) {
    nlohmann::json hf = read_json("config.json");
    if (c.value.is_null())
      hf.erase(c.key);
    else
      hf[c.key] = c.value;
    const std::string message = message_of<ConfigError>([&] { parse_umt5_config(hf, "config.json"); });
    EXPECT_NE(message.find(c.expected), std::string::npos) << c.key << ": " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

TEST(UMT5Config, PublishedXxlBuildsShapesOnly) {
  const UMT5Config c = parse_umt5_config(published_umt5_config("umt5-xxl"), "umt5-xxl");
  EXPECT_EQ(c.vocab_size, 256384);
  EXPECT_EQ(c.inner_dim(), 4096);
  parallel::ParamOptions options;
  options.shapes_only = true;
  auto model = std::make_shared<UMT5EncoderModel>(c, options);
  // shared 256384x4096 + 24 x (q, k, v, o 4096x4096; bias 32x64; wi_0, wi_1 10240x4096, wo 4096x10240;
  // two norms 4096) + final norm 4096.
  EXPECT_EQ(parameter_count(*model), 5680910336LL);
  const auto parameters = named_parameters(*model);
  EXPECT_EQ(parameters.size(), 24u * 10 + 2);
  for (const auto& [name, p] : parameters) EXPECT_TRUE(p.is_meta()) << name;
  EXPECT_THROW(published_umt5_config("umt5-small"), ConfigError);
}

TEST(UMT5Buckets, EqualHuggingFacesTables) {
  const nlohmann::json tables = read_json("relative_position_bucket.json");
  for (const char* name : {"this_config", "umt5_xxl"}) {
    const auto& t = tables[name];
    const int64_t buckets = t["num_buckets"], distance = t["max_distance"];
    ASSERT_EQ(t["relative_position"].size(), t["bucket"].size());
    ASSERT_GT(t["bucket"].size(), 0u);
    int64_t mismatches = 0;
    for (size_t i = 0; i < t["bucket"].size(); ++i) {
      const int64_t relative = t["relative_position"][i], expected = t["bucket"][i];
      const int64_t actual = relative_position_bucket(relative, buckets, distance);
      if (actual != expected && mismatches++ < 5)
        ADD_FAILURE() << name << ": bucket(" << relative << ") = " << actual << ", HF " << expected;
    }
    EXPECT_EQ(mismatches, 0) << name;
  }
}

TEST(UMT5Buckets, GridIsTheBucketOfKeyMinusQuery) {
  for (auto [queries, keys] : {std::pair<int64_t, int64_t>{12, 12}, {5, 9}, {9, 5}, {1, 600}}) {
    const at::Tensor grid = relative_position_buckets(queries, keys, 32, 128);
    ASSERT_EQ(grid.sizes(), (std::vector<int64_t>{queries, keys}));
    auto g = grid.accessor<int64_t, 2>();
    for (int64_t q = 0; q < queries; ++q)
      for (int64_t k = 0; k < keys; ++k)
        ASSERT_EQ(g[q][k], relative_position_bucket(k - q, 32, 128)) << q << "," << k;
  }
}

TEST(UMT5Mask, ExtendedMaskIsExact) {
  const at::Tensor mask = ids_tensor(read_json("input.json")["attention_mask"]);
  const at::Tensor extended = umt5_extended_attention_mask(mask, at::kFloat);
  const at::Tensor expected = read_f32("extended_attention_mask.bin", {kBatch, 1, 1, kLength});
  EXPECT_TRUE(at::equal(extended, expected));
  EXPECT_EQ(max_abs_diff("extended_attention_mask", extended, expected), 0.0);
  EXPECT_EQ(extended.min().item<float>(), std::numeric_limits<float>::lowest());  // not -inf
}

class UMT5Tiny : public ::testing::Test {
 protected:
  void SetUp() override {
    model = loaded_model();
    const nlohmann::json input = read_json("input.json");
    input_ids = ids_tensor(input["input_ids"]);
    attention_mask = ids_tensor(input["attention_mask"]);
  }
  std::shared_ptr<UMT5EncoderModel> model;
  at::Tensor input_ids, attention_mask;
};

TEST_F(UMT5Tiny, ParameterNamesAndShapesMatchHuggingFace) {
  std::ifstream in(kDir + "/state_dict.txt");
  std::map<std::string, std::string> expected;
  std::string line;
  while (std::getline(in, line)) {  // name \t [shape] \t dtype \t rule
    const auto tab1 = line.find('\t'), tab2 = line.find('\t', tab1 + 1);
    if (tab1 == std::string::npos || tab2 == std::string::npos) continue;
    expected[line.substr(0, tab1)] = line.substr(tab1 + 1, tab2 - tab1 - 1);
  }
  ASSERT_EQ(expected.size(), 22u);
  std::map<std::string, std::string> actual;
  for (const auto& [n, p] : named_parameters(*model))
    actual[n] = fmt::format("[{}]", fmt::join(p.sizes(), ", "));
  EXPECT_EQ(actual, expected);
}

TEST_F(UMT5Tiny, EveryLayerHasItsOwnPositionBias) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < 2; ++i) {
    const at::Tensor bias =
        model->encoder->block[i]->self_attention->attention->compute_bias(kLength, kLength);
    const at::Tensor expected =
        read_f32(fmt::format("position_bias_{}.bin", i), {1, kHeads, kLength, kLength});
    EXPECT_LE(max_abs_diff(fmt::format("position_bias_{}", i), bias, expected), 0.0);  // a lookup: exact
  }
}

TEST_F(UMT5Tiny, ForwardMatchesEveryReferenceOutput) {
  at::NoGradGuard no_grad;
  UMT5Trace trace;
  const at::Tensor out = model->forward(input_ids, attention_mask, &trace);
  const std::vector<int64_t> hidden{kBatch, kLength, kModel}, probabilities{kBatch, kHeads, kLength, kLength},
      bias{1, kHeads, kLength, kLength};
  ASSERT_EQ(trace.hidden_states.size(), 3u);
  ASSERT_EQ(trace.after_attention.size(), 2u);
  ASSERT_EQ(trace.block_outputs.size(), 2u);
  ASSERT_EQ(trace.attentions.size(), 2u);
  ASSERT_EQ(trace.position_bias.size(), 2u);
  EXPECT_EQ(max_abs_diff("extended mask (trace)", trace.extended_mask,
                         read_f32("extended_attention_mask.bin", {kBatch, 1, 1, kLength})),
            0.0);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_LE(max_abs_diff(fmt::format("hidden_states_{}", i), trace.hidden_states[i],
                           read_f32(fmt::format("hidden_states_{}.bin", i), hidden)),
              kTolerance);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_LE(max_abs_diff(fmt::format("block{}_after_attn", i), trace.after_attention[i],
                           read_f32(fmt::format("block{}_after_attn.bin", i), hidden)),
              kTolerance);
    EXPECT_LE(max_abs_diff(fmt::format("attentions_{}", i), trace.attentions[i],
                           read_f32(fmt::format("attentions_{}.bin", i), probabilities)),
              kTolerance);
    EXPECT_LE(max_abs_diff(fmt::format("position_bias_{} (trace)", i), trace.position_bias[i],
                           read_f32(fmt::format("position_bias_{}.bin", i), bias)),
              0.0);
  }
  EXPECT_LE(max_abs_diff("block1_out", trace.block_outputs[1], read_f32("block1_out.bin", hidden)),
            kTolerance);
  EXPECT_TRUE(at::equal(trace.block_outputs[0], trace.hidden_states[1]));
  EXPECT_LE(max_abs_diff("last_hidden_state", out, read_f32("last_hidden_state.bin", hidden)), kTolerance);
  // Padded keys get exactly zero probability, for every query row (padded queries included).
  for (const auto& p : trace.attentions) {  // (B, H, L_q, L_k); real lengths 9 and 5
    EXPECT_EQ(p.select(0, 0).narrow(-1, 9, kLength - 9).abs().max().item<float>(), 0.0F);
    EXPECT_EQ(p.select(0, 1).narrow(-1, 5, kLength - 5).abs().max().item<float>(), 0.0F);
  }
  // Without a trace the result is the same.
  EXPECT_TRUE(at::equal(model->forward(input_ids, attention_mask), out));
}

TEST_F(UMT5Tiny, LayersGiveTheForwardResult) {
  at::NoGradGuard no_grad;
  const core::Layers layers = model->layers();
  std::vector<std::string> names;
  for (const auto& layer : layers) names.push_back(layer->name());
  EXPECT_EQ(names, (std::vector<std::string>{"shared", "encoder.block.0", "encoder.block.1",
                                             "encoder.final_layer_norm"}));
  EXPECT_TRUE(layers[1]->block());
  EXPECT_FALSE(layers[0]->block());
  const auto context = model->context(input_ids, attention_mask);
  const at::Tensor hidden = core::run_layers(layers, {}, *context).get("hidden");
  EXPECT_TRUE(at::equal(hidden, model->forward(input_ids, attention_mask)));
  EXPECT_EQ(model->hf_config()["torch_dtype"], "float32");
  EXPECT_EQ(model->freeze_examples(), (std::vector<std::string>{"shared", "encoder"}));
}

TEST_F(UMT5Tiny, RefusesTokenIdsOutsideTheVocabulary) {
  at::NoGradGuard no_grad;
  const std::string message =
      message_of<ModelError>([&] { model->forward(input_ids + 100, attention_mask); });
  EXPECT_NE(message.find("token id 399 is outside the vocabulary [0, 300)"), std::string::npos) << message;
}

// A bfloat16 model computes as HF's does in bfloat16: wo stays float32, the result is bfloat16.
TEST_F(UMT5Tiny, RunsInBfloat16) {
  at::NoGradGuard no_grad;
  parallel::ParamOptions options;
  options.dtype = at::kBFloat16;
  auto half = std::make_shared<UMT5EncoderModel>(umt5_config_from_dir(kDir), options);
  load_parameters(*half, kDir);
  EXPECT_EQ(half->encoder->block[0]->feed_forward->dense->wo->weight.scalar_type(), at::kFloat);
  EXPECT_EQ(half->encoder->block[0]->feed_forward->dense->wi_0->weight.scalar_type(), at::kBFloat16);
  const at::Tensor out = half->forward(input_ids, attention_mask);
  EXPECT_EQ(out.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::isfinite(out).all().item<bool>());
  EXPECT_EQ(half->hf_config()["torch_dtype"], "bfloat16");
}

// A copy of the fixture's weights without one tensor: a CheckpointError naming it, not a model that
// runs with uninitialised memory in its place.
TEST(UMT5Weights, AMissingTensorIsACheckpointError) {
  std::string pattern = (fs::temp_directory_path() / "loom-umt5-test-XXXXXX").string();
  ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
  const std::string dir = pattern;
  fs::copy_file(kDir + "/config.json", dir + "/config.json");
  const std::string victim = "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight";
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  {
    const checkpoint::SafetensorsReader reader(kDir + "/model.safetensors");
    for (const auto& name : reader.names())
      if (name != victim) tensors.emplace_back(name, reader.load(name));
  }
  ASSERT_EQ(tensors.size(), 21u);
  checkpoint::save_safetensors(dir + "/model.safetensors", tensors);
  auto model = std::make_shared<UMT5EncoderModel>(umt5_config_from_dir(dir));
  std::string message = message_of<CheckpointError>([&] { load_parameters(*model, dir); });
  EXPECT_NE(message.find("tensor '" + victim + "' is missing"), std::string::npos) << message;
  std::error_code error;
  remove_tree(dir, error);

  // The fixture's own file read by a deeper model: the third block's tensors are missing.
  UMT5Config deeper = umt5_config_from_dir(kDir);
  deeper.num_layers = 3;
  auto three = std::make_shared<UMT5EncoderModel>(deeper);
  message = message_of<CheckpointError>([&] { load_parameters(*three, kDir); });
  EXPECT_NE(message.find("tensor 'encoder.block.2."), std::string::npos) << message;
}

}  // namespace
}  // namespace loom::models
