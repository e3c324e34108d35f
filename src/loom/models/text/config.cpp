#include "loom/models/text/config.h"

#include <fmt/format.h>

#include "loom/models/field_reader.h"
#include "loom/util/errors.h"

namespace loom::models {

TextModelConfig parse_text_model_config(const nlohmann::json& json, const std::string& source,
                                        const std::string& prefix) {
  if (!json.is_object()) throw ConfigError(fmt::format("{}: {} must be an object", source, prefix));
  const FieldReader f(json, source, prefix);
  TextModelConfig out;
  out.model_type = f.string("model_type");
  const bool qwen3 = out.model_type == "qwen3";
  if (out.model_type != "qwen2" && !qwen3)
    throw f.error("model_type", fmt::format("'{}' is not one of qwen2, qwen3", out.model_type));
  TextConfig& t = out.text;
  t.vocab_size = f.integer("vocab_size");
  t.hidden_size = f.integer("hidden_size");
  t.intermediate_size = f.integer("intermediate_size");
  t.num_layers = f.integer("num_hidden_layers");
  t.num_heads = f.integer("num_attention_heads");
  t.num_kv_heads = f.integer("num_key_value_heads", t.num_heads);
  t.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
  t.max_position_embeddings = f.integer("max_position_embeddings", 32768);
  t.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  t.mrope_section.clear();
  t.attention_bias = qwen3 ? f.boolean("attention_bias", false) : true;
  t.qk_norm = qwen3;
  if (qwen3) t.explicit_head_dim = f.integer("head_dim", t.hidden_size / std::max<int64_t>(t.num_heads, 1));
  out.bos_token_id = f.integer("bos_token_id", -1);
  for (auto [key, value] : {std::pair{"vocab_size", t.vocab_size},
                            {"hidden_size", t.hidden_size},
                            {"intermediate_size", t.intermediate_size},
                            {"num_hidden_layers", t.num_layers},
                            {"num_attention_heads", t.num_heads},
                            {"num_key_value_heads", t.num_kv_heads}})
    if (value < 1) throw f.error(key, fmt::format("must be >= 1, got {}", value));
  if (!qwen3 && t.hidden_size % t.num_heads)
    throw f.error("num_attention_heads",
                  fmt::format("{} does not divide hidden_size {}", t.num_heads, t.hidden_size));
  if (t.num_heads % t.num_kv_heads)
    throw f.error("num_key_value_heads",
                  fmt::format("{} does not divide num_attention_heads {}", t.num_kv_heads, t.num_heads));
  if (t.head_dim() < 2 || t.head_dim() % 2)
    throw f.error("head_dim", fmt::format("must be even for the rotary, got {}", t.head_dim()));
  if (f.has("hidden_act") && f.string("hidden_act") != "silu")
    throw f.error("hidden_act", fmt::format("'{}' is not silu, the only activation of Qwen2 and Qwen3's MLP",
                                            f.string("hidden_act")));
  if (f.boolean("use_sliding_window", false))
    throw f.error("use_sliding_window",
                  "sliding-window attention is not supported; every layer attends fully");
  // transformers 5 keeps the rotary base in rope_parameters; earlier exports in rope_theta, with the
  // scaling in rope_scaling.
  const char* rope_key = f.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  t.rope_theta = f.number("rope_theta", 1e6);
  if (f.has(rope_key)) {
    const nlohmann::json& rope_json = f.raw(rope_key);
    const FieldReader rope(rope_json, source, prefix + rope_key + ".");
    if (!f.has("rope_theta")) t.rope_theta = rope.number("rope_theta", 1e6);
    const std::string type = rope.string("rope_type", rope.string("type", "default"));
    if (type == "dynamic") {
      // Dynamic NTK scaling changes the base only past max_position_embeddings.
      out.dynamic_rope_limit = t.max_position_embeddings;
    } else if (type != "default") {
      throw rope.error("rope_type", fmt::format("'{}' is not one of default, dynamic", type));
    }
  }
  for (auto [key, value] : {std::pair{"rms_norm_eps", t.rms_norm_eps}, {"rope_theta", t.rope_theta}})
    if (!(value > 0)) throw f.error(key, fmt::format("must be > 0, got {}", value));
  return out;
}

}  // namespace loom::models
