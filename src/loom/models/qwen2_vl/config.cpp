#include "loom/models/qwen2_vl/config.h"

#include <fmt/format.h>

#include <cmath>
#include <optional>

#include "loom/models/field_reader.h"
#include "loom/util/errors.h"

namespace loom::models {

namespace {

using json = nlohmann::json;

void check_positive(const FieldReader& r, const char* key, int64_t value) {
  if (value <= 0) throw r.error(key, fmt::format("must be positive, got {}", value));
}

}  // namespace

Qwen2VLConfig parse_qwen2vl_config(const json& hf, const std::string& family, const std::string& source) {
  if (!hf.is_object()) throw ConfigError(source + ": a model config must be a JSON object");
  if (family != "qwen2_vl" && family != "qwen2_5_vl")
    throw ConfigError(fmt::format("model.family: '{}' is not one of qwen2_vl, qwen2_5_vl", family));
  Qwen2VLConfig config;
  config.hf = hf;
  FieldReader top(hf, source, "");
  const std::string model_type = top.string("model_type", family);
  if (model_type != family)
    throw top.error("model_type", fmt::format("'{}' does not match model.family '{}'", model_type, family));
  const bool is_25 = family == "qwen2_5_vl";

  // Text fields sit at the top level, or under text_config in newer exports.
  const json& text_json =
      hf.contains("text_config") && hf["text_config"].is_object() ? hf["text_config"] : hf;
  FieldReader text(text_json, source, &text_json == &hf ? "" : "text_config.");
  auto& t = config.text;
  t.vocab_size = text.integer("vocab_size");
  t.hidden_size = text.integer("hidden_size");
  t.intermediate_size = text.integer("intermediate_size");
  t.num_layers = text.integer("num_hidden_layers");
  t.num_heads = text.integer("num_attention_heads");
  t.num_kv_heads = text.integer("num_key_value_heads", t.num_heads);
  t.rms_norm_eps = text.number("rms_norm_eps", 1e-6);
  // transformers 5 keeps the rotary base and the M-RoPE sections in rope_parameters; earlier exports
  // in rope_theta and rope_scaling.
  const char* rope_key = text.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  if (!text.has(rope_key)) throw text.error("rope_scaling", "missing (M-RoPE needs mrope_section)");
  const json& scaling = text_json[rope_key];
  FieldReader rope(scaling, source, fmt::format("{}{}.", &text_json == &hf ? "" : "text_config.", rope_key));
  t.rope_theta = text.has("rope_theta") ? text.number("rope_theta") : rope.number("rope_theta", 1e6);
  t.tie_word_embeddings = top.boolean("tie_word_embeddings", text.boolean("tie_word_embeddings", false));
  t.max_position_embeddings = text.integer("max_position_embeddings", 32768);
  // A norm's eps of 0 or below divides by zero or a negative root (NaN from the first step that meets
  // a zero row); a base of 0 or below has no logarithm.
  for (auto [key, value] : {std::pair{"rms_norm_eps", t.rms_norm_eps}, {"rope_theta", t.rope_theta}})
    if (!(value > 0)) throw text.error(key, fmt::format("must be > 0, got {}", value));
  for (auto [key, value] : {std::pair{"vocab_size", t.vocab_size},
                            {"hidden_size", t.hidden_size},
                            {"intermediate_size", t.intermediate_size},
                            {"num_hidden_layers", t.num_layers},
                            {"num_attention_heads", t.num_heads},
                            {"num_key_value_heads", t.num_kv_heads}})
    check_positive(text, key, value);
  if (t.hidden_size % t.num_heads)
    throw text.error("num_attention_heads",
                     fmt::format("{} does not divide hidden_size {}", t.num_heads, t.hidden_size));
  if (t.num_heads % t.num_kv_heads)
    throw text.error("num_key_value_heads",
                     fmt::format("{} does not divide num_attention_heads {}", t.num_kv_heads, t.num_heads));
  const std::string rope_type = rope.string("type", rope.string("rope_type", "mrope"));
  if (rope_type != "mrope" && rope_type != "default")
    throw rope.error("type", fmt::format("'{}' is not one of mrope, default", rope_type));
  t.mrope_section = rope.integers("mrope_section", {});
  int64_t section_sum = 0;
  for (auto s : t.mrope_section) section_sum += s;
  if (t.mrope_section.size() != 3 || section_sum * 2 != t.head_dim())
    throw rope.error("mrope_section", fmt::format("must be 3 integers summing to head_dim/2 = {}, got {}",
                                                  t.head_dim() / 2, scaling["mrope_section"].dump()));

  auto& tok = config.tokens;
  tok.image = top.integer("image_token_id", 151655);
  tok.video = top.integer("video_token_id", 151656);
  tok.vision_start = top.integer("vision_start_token_id", 151652);
  tok.vision_end = top.integer("vision_end_token_id", 151653);
  tok.bos = top.integer("bos_token_id", text.integer("bos_token_id", 151643));
  tok.eos = top.integer("eos_token_id", text.integer("eos_token_id", 151645));
  for (auto [key, id] : {std::pair{"image_token_id", tok.image},
                         {"video_token_id", tok.video},
                         {"vision_start_token_id", tok.vision_start},
                         {"vision_end_token_id", tok.vision_end}})
    if (id < 0 || id >= t.vocab_size)
      throw top.error(key, fmt::format("{} is outside the vocabulary [0, {})", id, t.vocab_size));

  if (!top.has("vision_config")) throw top.error("vision_config", "missing required field");
  FieldReader vis(hf["vision_config"], source, "vision_config.");
  auto& v = config.vision;
  v.family = is_25 ? VisionFamily::qwen2_5_vl : VisionFamily::qwen2_vl;
  v.depth = vis.integer("depth");
  v.num_heads = vis.integer("num_heads");
  v.in_channels = vis.integer("in_channels", vis.integer("in_chans", 3));
  v.patch_size = vis.integer("patch_size", 14);
  v.temporal_patch_size = vis.integer("temporal_patch_size", 2);
  v.spatial_merge_size = vis.integer("spatial_merge_size", 2);
  if (is_25) {
    // Qwen2.5-VL: hidden_size is the ViT width, out_hidden_size the LLM width.
    v.width = vis.integer("hidden_size");
    v.out_width = vis.integer("out_hidden_size", t.hidden_size);
    v.mlp_hidden = vis.integer("intermediate_size");
    v.hidden_act = vis.string("hidden_act", "silu");
    v.window_size = vis.integer("window_size", 112);
    v.fullatt_block_indexes = vis.integers("fullatt_block_indexes", {});
    v.tokens_per_second = vis.number("tokens_per_second", 4.0);  // transformers' default
    for (auto i : v.fullatt_block_indexes)
      if (i < 0 || i >= v.depth)
        throw vis.error("fullatt_block_indexes", fmt::format("block {} is outside depth {}", i, v.depth));
    if (v.hidden_act != "silu")
      throw vis.error("hidden_act", fmt::format("'{}' is not supported (valid: silu)", v.hidden_act));
  } else {
    // Qwen2-VL: embed_dim is the ViT width, hidden_size the LLM width.
    v.width = vis.integer("embed_dim");
    v.out_width = vis.integer("hidden_size", t.hidden_size);
    v.mlp_hidden = v.width * vis.integer("mlp_ratio", 4);
    v.hidden_act = vis.string("hidden_act", "quick_gelu");
    if (v.hidden_act != "quick_gelu")
      throw vis.error("hidden_act", fmt::format("'{}' is not supported (valid: quick_gelu)", v.hidden_act));
  }
  for (auto [key, value] : {std::pair{"depth", v.depth},
                            {"num_heads", v.num_heads},
                            {"patch_size", v.patch_size},
                            {"temporal_patch_size", v.temporal_patch_size},
                            {"spatial_merge_size", v.spatial_merge_size}})
    check_positive(vis, key, value);
  if (v.width % v.num_heads || v.head_dim() % 4)
    throw vis.error(
        "num_heads",
        fmt::format("{} heads must divide the width {} into head dims divisible by 4", v.num_heads, v.width));
  if (v.out_width != t.hidden_size)
    throw vis.error(is_25 ? "out_hidden_size" : "hidden_size",
                    fmt::format("{} must equal the LLM hidden_size {}", v.out_width, t.hidden_size));
  return config;
}

std::vector<std::pair<std::string, std::string>> architecture_fields(const Qwen2VLConfig& c) {
  const auto& t = c.text;
  const auto& v = c.vision;
  auto text = [](const json& value) { return value.dump(); };
  const bool is_25 = c.family() == VisionFamily::qwen2_5_vl;
  return {{"model_type", text(c.model_type())},
          {"vocab_size", text(t.vocab_size)},
          {"hidden_size", text(t.hidden_size)},
          {"intermediate_size", text(t.intermediate_size)},
          {"num_hidden_layers", text(t.num_layers)},
          {"num_attention_heads", text(t.num_heads)},
          {"num_key_value_heads", text(t.num_kv_heads)},
          {"rms_norm_eps", text(t.rms_norm_eps)},
          {"rope_theta", text(t.rope_theta)},
          {"rope_scaling.mrope_section", text(t.mrope_section)},
          {"tie_word_embeddings", text(t.tie_word_embeddings)},
          {"vision_config.depth", text(v.depth)},
          {is_25 ? "vision_config.hidden_size" : "vision_config.embed_dim", text(v.width)},
          {"vision_config.num_heads", text(v.num_heads)},
          {is_25 ? "vision_config.intermediate_size" : "vision_config.mlp_ratio",
           text(is_25 ? v.mlp_hidden : v.mlp_hidden / v.width)},
          {"vision_config.in_channels", text(v.in_channels)},
          {"vision_config.patch_size", text(v.patch_size)},
          {"vision_config.temporal_patch_size", text(v.temporal_patch_size)},
          {"vision_config.spatial_merge_size", text(v.spatial_merge_size)},
          {"vision_config.hidden_act", text(v.hidden_act)},
          {"vision_config.window_size", text(v.window_size)},
          {"vision_config.fullatt_block_indexes", text(v.fullatt_block_indexes)}};
}

nlohmann::json to_hf_config(const Qwen2VLConfig& c) {
  json hf = c.hf.is_object() ? c.hf : json::object();
  const bool is_25 = c.family() == VisionFamily::qwen2_5_vl;
  hf["model_type"] = c.model_type();
  hf["architectures"] = {is_25 ? "Qwen2_5_VLForConditionalGeneration" : "Qwen2VLForConditionalGeneration"};
  json& text = hf.contains("text_config") && hf["text_config"].is_object() ? hf["text_config"] : hf;
  text["vocab_size"] = c.text.vocab_size;
  text["hidden_size"] = c.text.hidden_size;
  text["intermediate_size"] = c.text.intermediate_size;
  text["num_hidden_layers"] = c.text.num_layers;
  text["num_attention_heads"] = c.text.num_heads;
  text["num_key_value_heads"] = c.text.num_kv_heads;
  text["rms_norm_eps"] = c.text.rms_norm_eps;
  text["max_position_embeddings"] = c.text.max_position_embeddings;
  if (text.contains("rope_parameters")) {  // transformers 5's layout, kept as the source had it
    text["rope_parameters"]["rope_theta"] = c.text.rope_theta;
    text["rope_parameters"]["mrope_section"] = c.text.mrope_section;
  } else {
    text["rope_theta"] = c.text.rope_theta;
    text["rope_scaling"] = {{"type", "mrope"}, {"mrope_section", c.text.mrope_section}};
  }
  hf["tie_word_embeddings"] = c.text.tie_word_embeddings;
  hf["hidden_act"] = "silu";
  hf["image_token_id"] = c.tokens.image;
  hf["video_token_id"] = c.tokens.video;
  hf["vision_start_token_id"] = c.tokens.vision_start;
  hf["vision_end_token_id"] = c.tokens.vision_end;
  hf["bos_token_id"] = c.tokens.bos;
  hf["eos_token_id"] = c.tokens.eos;
  json& v = hf["vision_config"];
  if (!v.is_object()) v = json::object();
  v["depth"] = c.vision.depth;
  v["num_heads"] = c.vision.num_heads;
  v["in_channels"] = c.vision.in_channels;
  v["patch_size"] = c.vision.patch_size;
  v["temporal_patch_size"] = c.vision.temporal_patch_size;
  v["spatial_merge_size"] = c.vision.spatial_merge_size;
  v["hidden_act"] = c.vision.hidden_act;
  if (is_25) {
    v["hidden_size"] = c.vision.width;
    v["out_hidden_size"] = c.vision.out_width;
    v["intermediate_size"] = c.vision.mlp_hidden;
    v["window_size"] = c.vision.window_size;
    v["fullatt_block_indexes"] = c.vision.fullatt_block_indexes;
    // An integer where it is one: transformers 5 declares the field an int and refuses 2.0.
    const double tps = c.vision.tokens_per_second;
    if (tps == std::floor(tps) && std::abs(tps) < 1e15) {
      v["tokens_per_second"] = static_cast<int64_t>(tps);
    } else {
      v["tokens_per_second"] = tps;
    }
  } else {
    v["embed_dim"] = c.vision.width;
    v["hidden_size"] = c.vision.out_width;
    v["mlp_ratio"] = c.vision.mlp_hidden / c.vision.width;
  }
  hf["torch_dtype"] = "float32";
  return hf;
}

namespace {

json text_fields(int64_t vocab, int64_t hidden, int64_t inter, int64_t layers, int64_t heads, int64_t kv,
                 bool tied) {
  return {{"vocab_size", vocab},
          {"hidden_size", hidden},
          {"intermediate_size", inter},
          {"num_hidden_layers", layers},
          {"num_attention_heads", heads},
          {"num_key_value_heads", kv},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 1000000.0},
          {"max_position_embeddings", 32768},
          {"tie_word_embeddings", tied},
          {"rope_scaling", {{"type", "mrope"}, {"mrope_section", {16, 24, 24}}}},
          {"image_token_id", 151655},
          {"video_token_id", 151656},
          {"vision_start_token_id", 151652},
          {"vision_end_token_id", 151653},
          {"bos_token_id", 151643},
          {"eos_token_id", 151645}};
}

json qwen2_vl(int64_t vocab, int64_t hidden, int64_t inter, int64_t layers, int64_t heads, int64_t kv,
              bool tied) {
  json hf = text_fields(vocab, hidden, inter, layers, heads, kv, tied);
  hf["model_type"] = "qwen2_vl";
  hf["vision_config"] = {{"depth", 32},
                         {"embed_dim", 1280},
                         {"mlp_ratio", 4},
                         {"num_heads", 16},
                         {"hidden_size", hidden},
                         {"in_channels", 3},
                         {"patch_size", 14},
                         {"spatial_merge_size", 2},
                         {"temporal_patch_size", 2},
                         {"hidden_act", "quick_gelu"}};
  return hf;
}

json qwen2_5_vl(int64_t vocab, int64_t hidden, int64_t inter, int64_t layers, int64_t heads, int64_t kv,
                bool tied) {
  json hf = text_fields(vocab, hidden, inter, layers, heads, kv, tied);
  hf["model_type"] = "qwen2_5_vl";
  hf["vision_config"] = {{"depth", 32},
                         {"hidden_size", 1280},
                         {"intermediate_size", 3420},
                         {"num_heads", 16},
                         {"out_hidden_size", hidden},
                         {"in_chans", 3},
                         {"patch_size", 14},
                         {"spatial_merge_size", 2},
                         {"temporal_patch_size", 2},
                         {"window_size", 112},
                         {"fullatt_block_indexes", {7, 15, 23, 31}},
                         {"tokens_per_second", 2},
                         {"hidden_act", "silu"}};
  return hf;
}

}  // namespace

std::vector<std::string> published_config_names() {
  return {"qwen2-vl-2b", "qwen2-vl-7b", "qwen2.5-vl-3b", "qwen2.5-vl-7b"};
}

nlohmann::json published_hf_config(const std::string& name) {
  if (name == "qwen2-vl-2b") return qwen2_vl(151936, 1536, 8960, 28, 12, 2, true);
  if (name == "qwen2-vl-7b") return qwen2_vl(152064, 3584, 18944, 28, 28, 4, false);
  if (name == "qwen2.5-vl-3b") return qwen2_5_vl(151936, 2048, 11008, 36, 16, 2, true);
  if (name == "qwen2.5-vl-7b") return qwen2_5_vl(152064, 3584, 18944, 28, 28, 4, false);
  throw ConfigError(
      fmt::format("unknown published model '{}' (valid: qwen2-vl-2b, qwen2-vl-7b, qwen2.5-vl-3b, "
                  "qwen2.5-vl-7b)",
                  name));
}

}  // namespace loom::models
