// InternVL against transformers 5.25's own (tests/fixtures/internvl-tiny): the family found from
// config.json, the weights of the -hf files, of transformers 5's names and of the original
// remote-code checkpoint (q/k/v fused), the image embeddings and the logits of every sample (one
// tile, two tiles and a thumbnail, six and a thumbnail, two images), for a Qwen2 and a Qwen3 language
// model; the chat template and the processor give the fixture's input ids; packed samples and
// incremental decoding give what each sample alone gives.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "loom/checkpoint/safetensors.h"
#include "loom/data/chat_template.h"
#include "loom/data/image/decode.h"
#include "loom/data/tokenizer/tokenizer.h"
#include "loom/models/internvl/model.h"
#include "loom/models/internvl/names.h"
#include "loom/models/registry.h"
#include "loom/models/weights.h"
#include "reference_fixture.h"

namespace loom::models {
namespace {

const std::string kFixture = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/internvl-tiny";

std::shared_ptr<InternVLForConditionalGeneration> load(const std::string& dir) {
  const NamedModel named = find_model(dir);
  EXPECT_EQ(named.family->name, "internvl");
  auto model = std::dynamic_pointer_cast<InternVLForConditionalGeneration>(load_model(named, dir));
  model->eval();
  return model;
}

struct Sample {
  std::string name;
  VisionLanguageInputs inputs;
};

std::vector<Sample> samples() {
  const testing::ReferenceFixture inputs(kFixture + "/inputs", "internvl");
  const nlohmann::json json = inputs.json("inputs.json");
  std::vector<Sample> out;
  for (const auto& s : json["samples"]) {
    Sample sample;
    sample.name = s["name"];
    std::vector<int64_t> ids = s["input_ids"][0].get<std::vector<int64_t>>();
    sample.inputs.input_ids = at::tensor(ids, at::kLong).unsqueeze(0);
    std::vector<at::Tensor> pixels;
    std::vector<int64_t> grids;
    for (const auto& image : s["images"]) {
      const auto& info = json["images"][image.get<std::string>()];
      const std::vector<int64_t> shape = info["pixel_values_shape"].get<std::vector<int64_t>>();
      pixels.push_back(inputs.f32(info["pixel_values"], shape));
      grids.insert(grids.end(), {shape[0], 4, 4});
    }
    sample.inputs.pixel_values = at::cat(pixels);
    sample.inputs.image_grid_thw = at::tensor(grids, at::kLong).view({-1, 3});
    out.push_back(std::move(sample));
  }
  return out;
}

void expect_fixture_outputs(const InternVLForConditionalGeneration& model, const std::string& variant) {
  const testing::ReferenceFixture expected(kFixture + "/" + variant + "/expected", "internvl " + variant);
  const nlohmann::json shapes = expected.json("expected.json")["samples"];
  at::NoGradGuard no_grad;
  for (const Sample& s : samples()) {
    const auto& e = shapes[s.name];
    const at::Tensor embeds = model.image_embeddings(s.inputs.pixel_values, s.inputs.image_grid_thw);
    EXPECT_LE(expected.max_abs_diff(s.name + " image_embeds", embeds,
                                    expected.f32(e["image_embeds"]["file"],
                                                 e["image_embeds"]["shape"].get<std::vector<int64_t>>())),
              1e-4);
    const at::Tensor logits = model.whole_logits(model.hidden_states(s.inputs));
    EXPECT_LE(expected.max_abs_diff(
                  s.name + " logits", logits,
                  expected.f32(e["logits"]["file"], e["logits"]["shape"].get<std::vector<int64_t>>())),
              1e-4);
  }
}

TEST(InternVL, Qwen2LanguageModelGivesTransformersLogits) {
  expect_fixture_outputs(*load(kFixture + "/qwen2"), "qwen2");
}

TEST(InternVL, Qwen3LanguageModelGivesTransformersLogits) {
  expect_fixture_outputs(*load(kFixture + "/qwen3"), "qwen3");
}

// The original remote-code checkpoint (vision_model.*, mlp1.*, attn.qkv fused) holds the same weights.
TEST(InternVL, OriginalNamesLoadTheSameWeights) {
  const auto hf = load(kFixture + "/qwen2");
  const NamedModel named = find_model(kFixture + "/qwen2");
  auto original = std::dynamic_pointer_cast<InternVLForConditionalGeneration>(
      named.family->build(named.hf, named.source, {}));
  const std::string dir = kFixture + "/qwen2/original_names";
  EXPECT_EQ(internvl_layout(checkpoint::WeightSource(dir).names()), InternVLLayout::original);
  load_internvl_parameters(*original, dir, original->config.vision.hidden_size);
  const auto a = named_parameters(*hf), b = named_parameters(*original);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].second.equal(b[i].second)) << a[i].first;
  EXPECT_EQ(internvl_file_tensor("vision_tower.encoder.layer.1.attention.k_proj.weight",
                                 InternVLLayout::original, 32)
                .name,
            "vision_model.encoder.layers.1.attn.qkv.weight");
  EXPECT_EQ(internvl_file_tensor("language_model.lm_head.weight", InternVLLayout::transformers5, 32).name,
            "lm_head.weight");
}

// The fixture's prompts: the user's "<image>" placeholders with the text after them, through the
// ChatML template and the processor, give transformers' input ids (no default system message).
TEST(InternVL, ChatTemplateAndProcessorGiveTheFixturesIds) {
  const NamedModel named = find_model(kFixture + "/qwen2");
  const auto processor = make_processor("internvl", named.hf, named.source, kFixture + "/qwen2");
  const auto tokenizer = data::load_tokenizer(kFixture + "/qwen2/tokenizer.json");
  data::ChatTemplateOptions options;
  options.default_system = processor->default_system();
  options.processor = std::shared_ptr<const data::ImageProcessor>(processor.get(), [](auto*) {});
  const data::ChatTemplate chat(*tokenizer, options);
  const testing::ReferenceFixture inputs(kFixture + "/inputs", "internvl");
  const nlohmann::json json = inputs.json("inputs.json");
  for (const auto& s : json["samples"]) {
    data::Conversation conversation;
    std::vector<data::VisionInput> images;
    for (const auto& m : s["messages"]) {
      std::string content;
      if (m["content"].is_string()) {
        content = m["content"];
      } else {
        for (const auto& part : m["content"]) {
          if (part["type"] == "image") {
            content += "<image>\n";
            const std::string file = json["images"][part["image"].get<std::string>()]["file"];
            conversation.images.push_back(kFixture + "/inputs/" + file);
            images.push_back(processor->process(data::decode_image_file(conversation.images.back())));
          } else {
            content += part["text"].get<std::string>();
          }
        }
      }
      conversation.messages.push_back(
          {m["role"] == "user" ? data::Role::user : data::Role::assistant, content});
    }
    const data::ConversationExample ex = chat.apply(conversation, images);
    EXPECT_EQ(ex.input_ids, s["input_ids"][0].get<std::vector<int64_t>>()) << s["name"];
  }
}

// `loom shapes`: the published 1B configurations count transformers' parameters exactly (its own
// InternVLForConditionalGeneration on the meta device; 2.5 and 3 share an architecture), and the
// largest tensors keep the checkpoints' names and shapes.
TEST(InternVL, PublishedConfigurationsCountTheirParameters) {
  const std::map<std::string, int64_t> counts = {
      {"internvl2.5-1b", 938'193'024}, {"internvl3-1b", 938'193'024}, {"internvl3.5-1b", 1'060'897'792}};
  for (const auto& [name, count] : counts) {
    const NamedModel named = find_model(name);
    BuildOptions options;
    options.params.shapes_only = true;
    const auto model = named.family->build(named.hf, named.source, options);
    EXPECT_EQ(parameter_count(model->module()), count) << name;
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const auto& [param, tensor] : named_parameters(model->module()))
      shapes[param] = tensor.sizes().vec();
    using V = std::vector<int64_t>;
    EXPECT_EQ(shapes.at("vision_tower.embeddings.position_embeddings"), (V{1, 1025, 1024})) << name;
    EXPECT_EQ(shapes.at("multi_modal_projector.linear_1.weight")[1], 4096) << name;
    EXPECT_EQ(shapes.at("language_model.lm_head.weight")[0], name == "internvl3.5-1b" ? 151936 : 151674)
        << name;
  }
}

// Packed samples and a key/value cache give each sample's own logits.
TEST(InternVL, PackedAndDecodedAsAlone) {
  const auto model = load(kFixture + "/qwen3");
  const std::vector<Sample> all = samples();
  at::NoGradGuard no_grad;
  VisionLanguageInputs packed;
  std::vector<at::Tensor> ids, pixels, grids, alone;
  packed.cu_seqlens = {0};
  for (const Sample& s : {all[0], all[3]}) {
    ids.push_back(s.inputs.input_ids);
    pixels.push_back(s.inputs.pixel_values);
    grids.push_back(s.inputs.image_grid_thw);
    packed.cu_seqlens.push_back(packed.cu_seqlens.back() + s.inputs.input_ids.size(1));
    alone.push_back(model->whole_logits(model->hidden_states(s.inputs)));
  }
  packed.input_ids = at::cat(ids, 1);
  packed.pixel_values = at::cat(pixels);
  packed.image_grid_thw = at::cat(grids);
  const at::Tensor together = model->whole_logits(model->hidden_states(packed));
  EXPECT_TRUE(together.allclose(at::cat(alone, 1), 1e-5, 1e-5));
  // Decoding: the prompt without its last token, then that token, give the last token's logits.
  const Sample& s = all[1];
  const int64_t n = s.inputs.input_ids.size(1);
  VisionLanguageInputs prompt = s.inputs;
  prompt.input_ids = s.inputs.input_ids.narrow(1, 0, n - 1);
  auto decoder = model->decoder();
  decoder->prefill(prompt);
  const at::Tensor last = decoder->step(s.inputs.input_ids.select(1, n - 1));
  const at::Tensor whole = model->whole_logits(model->hidden_states(s.inputs)).select(1, n - 1);
  EXPECT_TRUE(last.allclose(whole, 1e-5, 1e-5)) << (last - whole).abs().max();
}

}  // namespace
}  // namespace loom::models
