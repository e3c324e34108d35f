#include "loom/models/internvl/config.h"

#include <fmt/format.h>

#include "loom/models/field_reader.h"
#include "loom/util/errors.h"

namespace loom::models {

using json = nlohmann::json;

InternVLConfig parse_internvl_config(const json& hf, const std::string& source) {
  if (!hf.is_object()) throw ConfigError(source + ": a model config must be a JSON object");
  const FieldReader top(hf, source);
  const std::string model_type = top.string("model_type", "internvl");
  if (model_type != "internvl")
    throw top.error("model_type",
                    fmt::format("'{}' is not internvl (an -hf InternVL checkpoint's)", model_type));
  if (!top.has("vision_config") || !hf["vision_config"].is_object())
    throw top.error("vision_config", "missing (the vision tower's settings)");
  if (!top.has("text_config") || !hf["text_config"].is_object())
    throw top.error("text_config", "missing (the language model's settings)");
  InternVLConfig c;
  c.hf = hf;
  c.vision = parse_intern_vision_config(hf["vision_config"], source);
  c.projector = parse_internvl_projector_config(hf, c.vision, source);
  c.language = parse_text_model_config(hf["text_config"], source, "text_config.");
  c.language.text.tie_word_embeddings =
      top.boolean("tie_word_embeddings", c.language.text.tie_word_embeddings);
  c.image_token_id = top.integer("image_token_id", 151667);
  if (c.image_token_id < 0 || c.image_token_id >= c.text().vocab_size)
    throw top.error("image_token_id",
                    fmt::format("{} is not an id of the {} tokens of text_config.vocab_size",
                                c.image_token_id, c.text().vocab_size));
  return c;
}

std::vector<std::pair<std::string, std::string>> internvl_architecture_fields(const InternVLConfig& c) {
  const auto text = [](auto v) { return json(v).dump(); };
  const InternVisionConfig& v = c.vision;
  const TextConfig& t = c.text();
  return {{"text_config.model_type", text(c.language.model_type)},
          {"text_config.vocab_size", text(t.vocab_size)},
          {"text_config.hidden_size", text(t.hidden_size)},
          {"text_config.intermediate_size", text(t.intermediate_size)},
          {"text_config.num_hidden_layers", text(t.num_layers)},
          {"text_config.num_attention_heads", text(t.num_heads)},
          {"text_config.num_key_value_heads", text(t.num_kv_heads)},
          {"text_config.head_dim", text(t.head_dim())},
          {"text_config.attention_bias", text(t.attention_bias)},
          {"text_config.rms_norm_eps", text(t.rms_norm_eps)},
          {"text_config.rope_theta", text(t.rope_theta)},
          {"tie_word_embeddings", text(t.tie_word_embeddings)},
          {"image_token_id", text(c.image_token_id)},
          {"vision_config.hidden_size", text(v.hidden_size)},
          {"vision_config.num_hidden_layers", text(v.num_hidden_layers)},
          {"vision_config.num_attention_heads", text(v.num_attention_heads)},
          {"vision_config.intermediate_size", text(v.intermediate_size)},
          {"vision_config.norm_type", text(v.norm_type)},
          {"vision_config.layer_norm_eps", text(v.layer_norm_eps)},
          {"vision_config.image_size", text(v.image_size)},
          {"vision_config.patch_size", text(v.patch_size)},
          {"vision_config.attention_bias", text(v.attention_bias)},
          {"vision_config.use_qk_norm", text(v.use_qk_norm)},
          {"vision_config.use_mean_pooling", text(v.use_mean_pooling)}};
}

namespace {

// InternViT-300M-448px-V2_5, the vision tower of every 1B model.
json intern_vit_300m() {
  return {{"model_type", "internvl_vision"}, {"hidden_size", 1024},          {"num_hidden_layers", 24},
          {"num_attention_heads", 16},       {"intermediate_size", 4096},    {"hidden_act", "gelu"},
          {"norm_type", "layer_norm"},       {"layer_norm_eps", 1e-6},       {"image_size", {448, 448}},
          {"patch_size", {14, 14}},          {"attention_bias", true},       {"use_qk_norm", false},
          {"use_mean_pooling", true},        {"layer_scale_init_value", 0.1}};
}

json internvl(json text, int64_t image_token_id) {
  return {{"model_type", "internvl"},
          {"architectures", {"InternVLForConditionalGeneration"}},
          {"downsample_ratio", 0.5},
          {"image_seq_length", 256},
          {"projector_hidden_act", "gelu"},
          {"vision_feature_layer", -1},
          {"vision_feature_select_strategy", "default"},
          {"image_token_id", image_token_id},
          {"tie_word_embeddings", false},
          {"vision_config", intern_vit_300m()},
          {"text_config", std::move(text)}};
}

// Qwen2.5-0.5B-Instruct's architecture, the language model of InternVL2.5-1B and InternVL3-1B, with
// the InternVL vocabulary (151674 tokens: Qwen2.5's and <img>, </img>, <IMG_CONTEXT>, ...).
json qwen2_5_0_5b() {
  return {{"model_type", "qwen2"},        {"vocab_size", 151674},
          {"hidden_size", 896},           {"intermediate_size", 4864},
          {"num_hidden_layers", 24},      {"num_attention_heads", 14},
          {"num_key_value_heads", 2},     {"rms_norm_eps", 1e-6},
          {"rope_theta", 1000000.0},      {"max_position_embeddings", 32768},
          {"tie_word_embeddings", false}, {"bos_token_id", 151643}};
}

}  // namespace

std::vector<std::string> internvl_published_names() {
  return {"internvl2.5-1b", "internvl3-1b", "internvl3.5-1b"};
}

json internvl_published_config(const std::string& name) {
  if (name == "internvl2.5-1b" || name == "internvl3-1b") return internvl(qwen2_5_0_5b(), 151667);
  if (name == "internvl3.5-1b")
    // Qwen3-0.6B's architecture, untied (InternVL3.5-1B's safetensors hold lm_head apart).
    return internvl({{"model_type", "qwen3"},
                     {"vocab_size", 151936},
                     {"hidden_size", 1024},
                     {"intermediate_size", 3072},
                     {"num_hidden_layers", 28},
                     {"num_attention_heads", 16},
                     {"num_key_value_heads", 8},
                     {"head_dim", 128},
                     {"attention_bias", false},
                     {"rms_norm_eps", 1e-6},
                     {"rope_theta", 1000000.0},
                     {"max_position_embeddings", 40960},
                     {"tie_word_embeddings", false},
                     {"bos_token_id", 151643}},
                    151671);
  throw ConfigError(fmt::format("'{}' is not a published InternVL configuration (valid: {})", name,
                                fmt::join(internvl_published_names(), ", ")));
}

}  // namespace loom::models
