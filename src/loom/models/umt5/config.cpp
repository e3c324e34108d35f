#include "loom/models/umt5/config.h"

#include <fmt/format.h>

#include <optional>

#include "loom/models/field_reader.h"
#include "loom/util/errors.h"

namespace loom::models {

namespace {

using json = nlohmann::json;

}  // namespace

UMT5Config parse_umt5_config(const json& hf, const std::string& source) {
  if (!hf.is_object()) throw ConfigError(source + ": a model config must be a JSON object");
  FieldReader r(hf, source);
  const std::string model_type = r.string("model_type", "umt5");
  if (model_type != "umt5")
    throw r.error("model_type",
                  fmt::format("'{}' is not umt5 (T5 reuses layer 0's relative attention bias in "
                              "every layer; only umT5 is supported)",
                              model_type));
  UMT5Config c;
  c.hf = hf;
  c.vocab_size = r.integer("vocab_size");
  c.d_model = r.integer("d_model");
  c.d_kv = r.integer("d_kv");
  c.d_ff = r.integer("d_ff");
  c.num_layers = r.integer("num_layers");
  c.num_heads = r.integer("num_heads");
  c.relative_attention_num_buckets = r.integer("relative_attention_num_buckets", 32);
  c.relative_attention_max_distance = r.integer("relative_attention_max_distance", 128);
  c.layer_norm_epsilon = r.number("layer_norm_epsilon", 1e-6);
  c.feed_forward_proj = r.string("feed_forward_proj", "gated-gelu");
  c.pad_token_id = r.integer("pad_token_id", 0);
  c.eos_token_id = r.integer("eos_token_id", 1);

  for (auto [key, value] : {std::pair{"vocab_size", c.vocab_size},
                            {"d_model", c.d_model},
                            {"d_kv", c.d_kv},
                            {"d_ff", c.d_ff},
                            {"num_layers", c.num_layers},
                            {"num_heads", c.num_heads}})
    if (value <= 0) throw r.error(key, fmt::format("must be positive, got {}", value));
  // A norm's eps of 0 or below divides by zero (or takes a negative root) on a zero row.
  if (!(c.layer_norm_epsilon > 0))
    throw r.error("layer_norm_epsilon", fmt::format("must be > 0, got {}", c.layer_norm_epsilon));
  // gated-gelu is wo(gelu_tanh(wi_0 x) * wi_1 x); the others have other weights (relu: wi, not wi_0/wi_1).
  if (c.feed_forward_proj != "gated-gelu")
    throw r.error("feed_forward_proj",
                  fmt::format("'{}' is not supported (valid: gated-gelu)", c.feed_forward_proj));
  // Bidirectional buckets: half per direction, of which half are exact distances and the rest
  // logarithmic up to max_distance; fewer than 4 leave no exact bucket (a log of r / 0).
  if (c.relative_attention_num_buckets < 4)
    throw r.error("relative_attention_num_buckets",
                  fmt::format("must be at least 4, got {}", c.relative_attention_num_buckets));
  const int64_t max_exact = c.relative_attention_num_buckets / 4;
  if (c.relative_attention_max_distance <= max_exact)
    throw r.error(
        "relative_attention_max_distance",
        fmt::format("{} must exceed the {} exact distances of relative_attention_num_buckets {}",
                    c.relative_attention_max_distance, max_exact, c.relative_attention_num_buckets));
  for (auto [key, id] : {std::pair{"pad_token_id", c.pad_token_id}, {"eos_token_id", c.eos_token_id}})
    if (id < 0 || id >= c.vocab_size)
      throw r.error(key, fmt::format("{} is outside the vocabulary [0, {})", id, c.vocab_size));
  return c;
}

UMT5Config umt5_config_from_dir(const std::string& dir) {
  const std::string path = dir + "/config.json";
  return parse_umt5_config(read_config_file(path), path);
}

json to_hf_config(const UMT5Config& c) {
  json hf = c.hf.is_object() ? c.hf : json::object();
  hf["model_type"] = "umt5";
  if (!hf.contains("architectures")) hf["architectures"] = {"UMT5EncoderModel"};
  hf["vocab_size"] = c.vocab_size;
  hf["d_model"] = c.d_model;
  hf["d_kv"] = c.d_kv;
  hf["d_ff"] = c.d_ff;
  hf["num_layers"] = c.num_layers;
  hf["num_heads"] = c.num_heads;
  hf["relative_attention_num_buckets"] = c.relative_attention_num_buckets;
  hf["relative_attention_max_distance"] = c.relative_attention_max_distance;
  hf["layer_norm_epsilon"] = c.layer_norm_epsilon;
  hf["feed_forward_proj"] = c.feed_forward_proj;
  // What transformers derives from feed_forward_proj "gated-gelu".
  hf["dense_act_fn"] = "gelu_new";
  hf["is_gated_act"] = true;
  hf["pad_token_id"] = c.pad_token_id;
  hf["eos_token_id"] = c.eos_token_id;
  if (!hf.contains("torch_dtype")) hf["torch_dtype"] = "float32";
  return hf;
}

std::vector<std::string> published_umt5_config_names() { return {"umt5-xxl"}; }

json published_umt5_config(const std::string& name) {
  if (name == "umt5-xxl")
    return {{"model_type", "umt5"},
            {"architectures", {"UMT5EncoderModel"}},
            {"vocab_size", 256384},
            {"d_model", 4096},
            {"d_kv", 64},
            {"d_ff", 10240},
            {"num_layers", 24},
            {"num_heads", 64},
            {"relative_attention_num_buckets", 32},
            {"relative_attention_max_distance", 128},
            {"layer_norm_epsilon", 1e-6},
            {"feed_forward_proj", "gated-gelu"},
            {"dense_act_fn", "gelu_new"},
            {"is_gated_act", true},
            {"tie_word_embeddings", false},
            {"pad_token_id", 0},
            {"eos_token_id", 1}};
  throw ConfigError(fmt::format("unknown published model '{}' (valid: umt5-xxl)", name));
}

}  // namespace loom::models
