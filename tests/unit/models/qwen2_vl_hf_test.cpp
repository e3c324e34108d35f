// Loom's Qwen2-VL against outputs of HuggingFace transformers' own implementation on a tiny
// random model (tests/fixtures/hf-qwen2-vl-tiny, see its README). The expected outputs are only
// compared against, never fed into the computation.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "loom/data/image/decode.h"
#include "loom/data/image/qwen2vl_processor.h"
#include "loom/models/qwen2_vl/spec.h"
#include "loom/models/weights.h"

namespace loom::models {
namespace {

const std::string kDir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/hf-qwen2-vl-tiny";

at::Tensor read_f32(const std::string& name, at::IntArrayRef shape) {
  std::ifstream in(kDir + "/" + name, std::ios::binary);
  EXPECT_TRUE(in.good()) << name;
  auto t = at::empty(shape, at::kFloat);
  in.read(reinterpret_cast<char*>(t.data_ptr<float>()), t.numel() * sizeof(float));
  EXPECT_EQ(in.gcount(), static_cast<std::streamsize>(t.numel() * sizeof(float))) << name;
  return t;
}

nlohmann::json read_input() {
  std::ifstream in(kDir + "/input.json");
  return nlohmann::json::parse(in);
}

at::Tensor ids_tensor(const nlohmann::json& rows) {
  std::vector<int64_t> flat;
  for (const auto& row : rows)
    for (const auto& v : row) flat.push_back(v.get<int64_t>());
  return at::tensor(flat, at::kLong).view({static_cast<int64_t>(rows.size()), -1});
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

class HfQwen2VLTiny : public ::testing::Test {
 protected:
  void SetUp() override {
    config = model_config_from_dir(kDir);
    model = build_model(config, {});
    load_parameters(*model, kDir);
    input = read_input();
    auto image = data::decode_image_file(kDir + "/image.png");
    vision = data::qwen2vl_process_image(image);
  }
  Qwen2VLConfig config;
  std::shared_ptr<Qwen2VLForConditionalGeneration> model;
  nlohmann::json input;
  data::VisionInput vision;
};

TEST_F(HfQwen2VLTiny, PixelValuesFromTheImage) {
  EXPECT_EQ(vision.grid_thw, (std::array<int64_t, 3>{1, 4, 6}));
  auto expected = read_f32("pixel_values.bin", {24, 1176});
  ASSERT_EQ(vision.pixel_values.sizes(), expected.sizes());
  EXPECT_LT(max_abs_diff(vision.pixel_values, expected), 1e-5);
}

TEST_F(HfQwen2VLTiny, PositionIdsExact) {
  auto ids = ids_tensor(input["input_ids"]);
  auto grid = at::tensor(std::vector<int64_t>(vision.grid_thw.begin(), vision.grid_thw.end()), at::kLong)
                  .view({1, 3});
  auto rope = rope_index(ids, grid, at::Tensor(), config);
  std::vector<int64_t> expected;
  for (const auto& axis : input["position_ids"])
    for (const auto& row : axis)
      for (const auto& v : row) expected.push_back(v.get<int64_t>());
  EXPECT_TRUE(at::equal(rope.position_ids, at::tensor(expected, at::kLong).view({3, 1, -1})));
  EXPECT_EQ(rope.rope_deltas.item<int64_t>(), input["rope_deltas"][0][0].get<int64_t>());
}

TEST_F(HfQwen2VLTiny, ImageEmbeddingsAndLogits) {
  at::NoGradGuard no_grad;
  auto grid = at::tensor(std::vector<int64_t>(vision.grid_thw.begin(), vision.grid_thw.end()), at::kLong)
                  .view({1, 3});
  auto embeds = model->image_embeddings(vision.pixel_values, grid);
  EXPECT_LT(max_abs_diff(embeds, read_f32("image_embeds.bin", {6, 64})), 1e-4);

  VisionLanguageInputs in;
  in.input_ids = ids_tensor(input["input_ids"]);
  in.attention_mask = ids_tensor(input["attention_mask"]);
  in.pixel_values = vision.pixel_values;
  in.image_grid_thw = grid;
  auto logits = model->forward(in);
  auto expected = read_f32("logits.bin", {1, 21, 256});
  ASSERT_EQ(logits.sizes(), expected.sizes());
  EXPECT_LT(max_abs_diff(logits, expected), 1e-4);
}

TEST_F(HfQwen2VLTiny, ParameterNamesAndShapesMatchHuggingFace) {
  std::ifstream in(kDir + "/state_dict_names.txt");
  std::map<std::string, std::string> expected;
  std::string line;
  while (std::getline(in, line)) {  // name \t [shape] \t dtype
    const auto tab1 = line.find('\t'), tab2 = line.rfind('\t');
    if (tab1 == std::string::npos || tab2 == tab1) continue;
    expected[line.substr(0, tab1)] = line.substr(tab1 + 1, tab2 - tab1 - 1);
  }
  ASSERT_FALSE(expected.empty());
  std::map<std::string, std::string> actual;
  for (const auto& [n, p] : named_parameters(*model))
    actual[n] = fmt::format("[{}]", fmt::join(p.sizes(), ", "));
  EXPECT_EQ(actual, expected);
}

}  // namespace
}  // namespace loom::models
