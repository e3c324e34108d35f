#include "loom/models/qwen3_5/config.h"

#include <fmt/format.h>

#include "loom/models/field_reader.h"

namespace loom::models::qwen3_5 {

Config parse_config(const nlohmann::json& hf, const std::string& source) {
  Config c;
  c.hf = hf;
  const FieldReader top(hf, source);
  const std::string model_type = top.string("model_type");
  if (model_type != "qwen3_5" && model_type != "qwen3_5_moe")
    throw top.error("model_type", fmt::format("'{}' is not qwen3_5 or qwen3_5_moe", model_type));
  if (!hf.contains("text_config") || !hf["text_config"].is_object())
    throw top.error("text_config", "missing required field");
  if (!hf.contains("vision_config") || !hf["vision_config"].is_object())
    throw top.error("vision_config", "missing required field");
  const nlohmann::json& tj = hf["text_config"];
  const FieldReader t(tj, source, "text_config.");
  TextConfig& text = c.text;
  text.vocab_size = t.integer("vocab_size");
  text.hidden_size = t.integer("hidden_size");
  text.rms_norm_eps = t.number("rms_norm_eps", 1e-6);
  const int64_t layers = t.integer("num_hidden_layers");
  if (t.has("layer_types")) {
    for (const auto& type : tj["layer_types"]) text.layer_types.push_back(type.get<std::string>());
    if (static_cast<int64_t>(text.layer_types.size()) != layers)
      throw t.error("layer_types",
                    fmt::format("lists {} layers for num_hidden_layers {}", text.layer_types.size(), layers));
  } else {
    const int64_t interval = t.integer("full_attention_interval", 4);
    if (interval < 1) throw t.error("full_attention_interval", "must be at least 1");
    for (int64_t i = 0; i < layers; ++i)
      text.layer_types.push_back((i + 1) % interval ? "linear_attention" : "full_attention");
  }
  AttentionConfig& attention = text.attention;
  attention.hidden_size = text.hidden_size;
  attention.num_heads = t.integer("num_attention_heads");
  attention.num_kv_heads = t.integer("num_key_value_heads");
  attention.head_dim = t.integer("head_dim", text.hidden_size / attention.num_heads);
  attention.bias = t.boolean("attention_bias", false);
  attention.rms_norm_eps = text.rms_norm_eps;
  GatedDeltaNetConfig& linear = text.linear;
  linear.hidden_size = text.hidden_size;
  linear.num_key_heads = t.integer("linear_num_key_heads");
  linear.num_value_heads = t.integer("linear_num_value_heads");
  linear.key_head_dim = t.integer("linear_key_head_dim");
  linear.value_head_dim = t.integer("linear_value_head_dim");
  linear.conv_kernel = t.integer("linear_conv_kernel_dim", 4);
  linear.rms_norm_eps = text.rms_norm_eps;
  const nlohmann::json rope = tj.contains("rope_parameters") && tj["rope_parameters"].is_object()
                                  ? tj["rope_parameters"]
                                  : nlohmann::json::object();
  const FieldReader r(rope, source, "text_config.rope_parameters.");
  if (r.string("rope_type", "default") != "default")
    throw r.error("rope_type",
                  fmt::format("'{}' is not supported; Qwen3.5 uses default", r.string("rope_type")));
  text.rotary.theta = r.number("rope_theta", t.number("rope_theta", 10000.0));
  const double partial = r.number("partial_rotary_factor", t.number("partial_rotary_factor", 0.25));
  text.rotary.rotary_dim = static_cast<int64_t>(static_cast<double>(attention.head_dim) * partial);
  text.rotary.sections = r.integers("mrope_section", std::vector<int64_t>{11, 11, 10});
  if (model_type == "qwen3_5_moe") {
    text.num_experts = t.integer("num_experts");
    text.num_experts_per_tok = t.integer("num_experts_per_tok");
    text.moe_intermediate_size = t.integer("moe_intermediate_size");
    text.shared_expert_intermediate_size = t.integer("shared_expert_intermediate_size");
    text.router_aux_loss_coef = t.number("router_aux_loss_coef", 0.001);
    text.output_router_logits = t.boolean("output_router_logits", false);
    if (text.num_experts < 1) throw t.error("num_experts", "must be at least 1");
  } else {
    text.intermediate_size = t.integer("intermediate_size");
  }
  c.max_position_embeddings = t.integer("max_position_embeddings", 32768);

  const FieldReader v(hf["vision_config"], source, "vision_config.");
  VisionConfig& vision = c.vision;
  vision.depth = v.integer("depth");
  vision.hidden_size = v.integer("hidden_size");
  vision.intermediate_size = v.integer("intermediate_size");
  vision.num_heads = v.integer("num_heads");
  vision.in_channels = v.integer("in_channels", 3);
  vision.patch_size = v.integer("patch_size", 16);
  vision.spatial_merge_size = v.integer("spatial_merge_size", 2);
  vision.temporal_patch_size = v.integer("temporal_patch_size", 2);
  vision.out_hidden_size = v.integer("out_hidden_size");
  vision.num_position_embeddings = v.integer("num_position_embeddings", 2304);
  if (vision.hidden_size % vision.num_heads != 0)
    throw v.error("num_heads",
                  fmt::format("{} heads do not divide hidden_size {}", vision.num_heads, vision.hidden_size));
  if (vision.out_hidden_size != text.hidden_size)
    throw v.error("out_hidden_size", fmt::format("{} is not the language model's hidden_size {}",
                                                 vision.out_hidden_size, text.hidden_size));
  if (v.string("hidden_act", "gelu_pytorch_tanh") != "gelu_pytorch_tanh")
    throw v.error("hidden_act", "Qwen3.5's vision blocks use gelu_pytorch_tanh");

  c.image_token_id = top.integer("image_token_id", 248056);
  c.video_token_id = top.integer("video_token_id", 248057);
  c.vision_start_token_id = top.integer("vision_start_token_id", 248053);
  c.vision_end_token_id = top.integer("vision_end_token_id", 248054);
  c.tie_word_embeddings = top.boolean("tie_word_embeddings", false);
  c.bos_token_id = t.integer("bos_token_id", top.integer("bos_token_id", 0));
  return c;
}

namespace {

// What Qwen3.5's published config.json files share: the vocabulary and token ids, the hybrid layout
// (full attention every 4 layers), the linear layers' 128-wide heads, 256-wide attention heads with a
// quarter of them rotary (interleaved M-RoPE, theta 1e7) and the vision tower's patches.
nlohmann::json published_base(const char* model_type, int64_t hidden, int64_t layers) {
  return {{"model_type", model_type},
          {"image_token_id", 248056},
          {"video_token_id", 248057},
          {"vision_start_token_id", 248053},
          {"vision_end_token_id", 248054},
          {"text_config",
           {{"vocab_size", 248320},
            {"hidden_size", hidden},
            {"num_hidden_layers", layers},
            {"full_attention_interval", 4},
            {"head_dim", 256},
            {"linear_num_key_heads", 16},
            {"linear_key_head_dim", 128},
            {"linear_value_head_dim", 128},
            {"linear_conv_kernel_dim", 4},
            {"rms_norm_eps", 1e-6},
            {"max_position_embeddings", 262144},
            {"attention_bias", false},
            {"rope_parameters",
             {{"rope_type", "default"},
              {"rope_theta", 10000000},
              {"partial_rotary_factor", 0.25},
              {"mrope_section", {11, 11, 10}},
              {"mrope_interleaved", true}}}}},
          {"vision_config",
           {{"in_channels", 3},
            {"patch_size", 16},
            {"spatial_merge_size", 2},
            {"temporal_patch_size", 2},
            {"num_position_embeddings", 2304},
            {"hidden_act", "gelu_pytorch_tanh"},
            {"out_hidden_size", hidden}}}};
}

}  // namespace

std::vector<std::string> published_names(const std::string& model_type) {
  if (model_type == "qwen3_5") return {"qwen3.5-0.8b"};
  if (model_type == "qwen3_5_moe") return {"qwen3.5-35b-a3b"};
  return {};
}

nlohmann::json published_config(const std::string& name) {
  if (name == "qwen3.5-0.8b") {
    nlohmann::json hf = published_base("qwen3_5", 1024, 24);
    hf["tie_word_embeddings"] = true;
    hf["text_config"].update({{"num_attention_heads", 8},
                              {"num_key_value_heads", 2},
                              {"intermediate_size", 3584},
                              {"linear_num_value_heads", 16}});
    hf["vision_config"].update(
        {{"depth", 12}, {"hidden_size", 768}, {"intermediate_size", 3072}, {"num_heads", 12}});
    return hf;
  }
  if (name == "qwen3.5-35b-a3b") {
    nlohmann::json hf = published_base("qwen3_5_moe", 2048, 40);
    hf["tie_word_embeddings"] = false;
    hf["text_config"].update({{"num_attention_heads", 16},
                              {"num_key_value_heads", 2},
                              {"linear_num_value_heads", 32},
                              {"num_experts", 256},
                              {"num_experts_per_tok", 8},
                              {"moe_intermediate_size", 512},
                              {"shared_expert_intermediate_size", 512},
                              {"router_aux_loss_coef", 0.001}});
    hf["vision_config"].update(
        {{"depth", 27}, {"hidden_size", 1152}, {"intermediate_size", 4304}, {"num_heads", 16}});
    return hf;
  }
  throw ConfigError(
      fmt::format("no published Qwen3.5 configuration is named '{}'; Loom knows qwen3.5-0.8b and "
                  "qwen3.5-35b-a3b",
                  name));
}

std::vector<std::pair<std::string, std::string>> architecture_fields(const Config& c) {
  const TextConfig& t = c.text;
  std::vector<std::pair<std::string, std::string>> out = {
      {"text_config.vocab_size", std::to_string(t.vocab_size)},
      {"text_config.hidden_size", std::to_string(t.hidden_size)},
      {"text_config.layer_types", nlohmann::json(t.layer_types).dump()},
      {"text_config.num_attention_heads", std::to_string(t.attention.num_heads)},
      {"text_config.num_key_value_heads", std::to_string(t.attention.num_kv_heads)},
      {"text_config.head_dim", std::to_string(t.attention.head_dim)},
      {"text_config.linear_num_key_heads", std::to_string(t.linear.num_key_heads)},
      {"text_config.linear_num_value_heads", std::to_string(t.linear.num_value_heads)},
      {"text_config.linear_key_head_dim", std::to_string(t.linear.key_head_dim)},
      {"text_config.linear_value_head_dim", std::to_string(t.linear.value_head_dim)},
      {"text_config.linear_conv_kernel_dim", std::to_string(t.linear.conv_kernel)},
      {"text_config.intermediate_size", std::to_string(t.intermediate_size)},
      {"text_config.num_experts", std::to_string(t.num_experts)},
      {"text_config.num_experts_per_tok", std::to_string(t.num_experts_per_tok)},
      {"text_config.moe_intermediate_size", std::to_string(t.moe_intermediate_size)},
      {"text_config.shared_expert_intermediate_size", std::to_string(t.shared_expert_intermediate_size)},
      {"vision_config.depth", std::to_string(c.vision.depth)},
      {"vision_config.hidden_size", std::to_string(c.vision.hidden_size)},
      {"vision_config.intermediate_size", std::to_string(c.vision.intermediate_size)},
      {"vision_config.num_heads", std::to_string(c.vision.num_heads)},
      {"vision_config.patch_size", std::to_string(c.vision.patch_size)},
      {"vision_config.num_position_embeddings", std::to_string(c.vision.num_position_embeddings)},
      {"tie_word_embeddings", c.tie_word_embeddings ? "true" : "false"},
  };
  return out;
}

}  // namespace loom::models::qwen3_5
