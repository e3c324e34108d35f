#include "loom/models/wan/config.h"

#include <fmt/format.h>

#include <optional>

#include "loom/models/field_reader.h"
#include "loom/util/errors.h"

namespace loom::models {

namespace {

using json = nlohmann::json;

constexpr const char* kWanClass = "WanModel";
constexpr const char* kDiffusersClass = "WanTransformer3DModel";

bool is_diffusers_config(const FieldReader& r) {
  if (r.has("_class_name")) return r.raw("_class_name") == kDiffusersClass;
  return r.has("attention_head_dim") && !r.has("dim");
}

// Wan's own keys (WanModel's constructor arguments). The sizes that make a model have no default.
void read_wan_keys(const FieldReader& r, WanConfig& c) {
  c.model_type = r.string("model_type", "t2v");
  c.patch_size = r.integer_array<3>("patch_size", {1, 2, 2});
  c.text_len = r.integer("text_len", 512);
  c.in_dim = r.integer("in_dim", 16);
  c.dim = r.integer("dim");
  c.ffn_dim = r.integer("ffn_dim");
  c.freq_dim = r.integer("freq_dim", 256);
  c.text_dim = r.integer("text_dim", 4096);
  c.out_dim = r.integer("out_dim", 16);
  c.num_heads = r.integer("num_heads");
  c.num_layers = r.integer("num_layers");
  c.window_size = r.integer_array<2>("window_size", {-1, -1});
  c.qk_norm = r.boolean("qk_norm", true);
  c.cross_attn_norm = r.boolean("cross_attn_norm", true);
  c.eps = r.number("eps", 1e-6);
  c.rope_max_positions = r.integer("rope_max_seq_len", 1024);  // not a Wan key; written when not 1024
}

// diffusers' WanTransformer3DModel keys. Its image-conditioned variants (image_dim,
// added_kv_proj_dim, pos_embed_seq_len) have weights a t2v model does not.
void read_diffusers_keys(const FieldReader& r, WanConfig& c) {
  for (const char* key : {"image_dim", "added_kv_proj_dim", "pos_embed_seq_len"})
    if (r.has(key))
      throw r.error(key, fmt::format("{} is set: an image-to-video model, which Loom does not run (only t2v)",
                                     r.raw(key).dump()));
  const int64_t heads = r.integer("num_attention_heads");
  const int64_t head_dim = r.integer("attention_head_dim");
  if (heads <= 0) throw r.error("num_attention_heads", fmt::format("must be positive, got {}", heads));
  if (head_dim <= 0) throw r.error("attention_head_dim", fmt::format("must be positive, got {}", head_dim));
  c.num_heads = heads;
  c.dim = heads * head_dim;
  c.in_dim = r.integer("in_channels", 16);
  c.out_dim = r.integer("out_channels", c.in_dim);
  c.text_dim = r.integer("text_dim", 4096);
  c.freq_dim = r.integer("freq_dim", 256);
  c.ffn_dim = r.integer("ffn_dim");
  c.num_layers = r.integer("num_layers");
  c.patch_size = r.integer_array<3>("patch_size", {1, 2, 2});
  c.cross_attn_norm = r.boolean("cross_attn_norm", true);
  // diffusers names the kind of q/k norm; Wan's is one RMSNorm over all heads together.
  const std::string qk_norm = r.has("qk_norm") ? r.string("qk_norm", "") : "";
  if (!qk_norm.empty() && qk_norm != "rms_norm_across_heads")
    throw r.error("qk_norm",
                  fmt::format("'{}' is not supported (valid: rms_norm_across_heads, null)", qk_norm));
  c.qk_norm = !qk_norm.empty();
  c.eps = r.number("eps", 1e-6);
  c.rope_max_positions = r.integer("rope_max_seq_len", 1024);
  c.text_len = r.integer("text_len", 512);  // not a diffusers key: the pipeline's max_sequence_length
}

}  // namespace

WanConfig parse_wan_config(const json& hf, const std::string& source) {
  if (!hf.is_object()) throw ConfigError(source + ": a model config must be a JSON object");
  FieldReader r(hf, source);
  if (r.has("_class_name")) {
    const std::string name = r.string("_class_name", "");
    if (name != kWanClass && name != kDiffusersClass)
      throw r.error("_class_name", fmt::format("'{}' is not a Wan2.1 text-to-video DiT (valid: {}, {})", name,
                                               kWanClass, kDiffusersClass));
  }
  WanConfig c;
  if (is_diffusers_config(r)) {
    read_diffusers_keys(r, c);
  } else {
    read_wan_keys(r, c);
    c.hf = hf;
  }

  if (c.model_type != "t2v")
    throw r.error("model_type",
                  fmt::format("'{}' is not supported (valid: t2v; i2v, flf2v and vace take image inputs)",
                              c.model_type));
  if (c.window_size != std::array<int64_t, 2>{-1, -1})
    throw r.error("window_size", fmt::format("[{}, {}] is not supported (valid: [-1, -1], global attention)",
                                             c.window_size[0], c.window_size[1]));
  for (auto [key, value] : {std::pair{"text_len", c.text_len},
                            {"in_dim", c.in_dim},
                            {"dim", c.dim},
                            {"ffn_dim", c.ffn_dim},
                            {"freq_dim", c.freq_dim},
                            {"text_dim", c.text_dim},
                            {"out_dim", c.out_dim},
                            {"num_heads", c.num_heads},
                            {"num_layers", c.num_layers},
                            {"rope_max_seq_len", c.rope_max_positions}})
    if (value <= 0) throw r.error(key, fmt::format("must be positive, got {}", value));
  for (int64_t p : c.patch_size)
    if (p <= 0)
      throw r.error("patch_size", fmt::format("[{}, {}, {}] must be positive", c.patch_size[0],
                                              c.patch_size[1], c.patch_size[2]));
  if (c.dim % c.num_heads)
    throw r.error("num_heads", fmt::format("{} does not divide dim {}", c.num_heads, c.dim));
  // The rotary embedding turns pairs of a head's channels.
  if (c.head_dim() % 2)
    throw r.error("num_heads", fmt::format("dim {} / {} heads = head_dim {}, which must be even", c.dim,
                                           c.num_heads, c.head_dim()));
  // The sinusoid is [cos | sin] of freq_dim / 2 frequencies.
  if (c.freq_dim % 2) throw r.error("freq_dim", fmt::format("must be even, got {}", c.freq_dim));
  // A norm's eps of 0 or below divides by zero (or takes a negative root) on a zero row.
  if (!(c.eps > 0)) throw r.error("eps", fmt::format("must be > 0, got {}", c.eps));
  return c;
}

WanConfig wan_config_from_dir(const std::string& dir) {
  const std::string path = dir + "/config.json";
  return parse_wan_config(read_config_file(path), path);
}

json to_hf_config(const WanConfig& c) {
  json hf = c.hf.is_object() ? c.hf : json::object();
  hf["_class_name"] = kWanClass;
  hf["model_type"] = c.model_type;
  hf["patch_size"] = c.patch_size;
  hf["text_len"] = c.text_len;
  hf["in_dim"] = c.in_dim;
  hf["dim"] = c.dim;
  hf["ffn_dim"] = c.ffn_dim;
  hf["freq_dim"] = c.freq_dim;
  hf["text_dim"] = c.text_dim;
  hf["out_dim"] = c.out_dim;
  hf["num_heads"] = c.num_heads;
  hf["num_layers"] = c.num_layers;
  hf["window_size"] = c.window_size;
  hf["qk_norm"] = c.qk_norm;
  hf["cross_attn_norm"] = c.cross_attn_norm;
  hf["eps"] = c.eps;
  // Wan's tables are always 1024 positions; written only when another size was read (from diffusers).
  if (c.rope_max_positions != 1024)
    hf["rope_max_seq_len"] = c.rope_max_positions;
  else
    hf.erase("rope_max_seq_len");
  return hf;
}

namespace {

json wan_t2v(int64_t dim, int64_t ffn_dim, int64_t num_heads, int64_t num_layers) {
  return {{"_class_name", kWanClass},
          {"model_type", "t2v"},
          {"patch_size", {1, 2, 2}},
          {"text_len", 512},
          {"in_dim", 16},
          {"dim", dim},
          {"ffn_dim", ffn_dim},
          {"freq_dim", 256},
          {"text_dim", 4096},
          {"out_dim", 16},
          {"num_heads", num_heads},
          {"num_layers", num_layers},
          {"window_size", {-1, -1}},
          {"qk_norm", true},
          {"cross_attn_norm", true},
          {"eps", 1e-6}};
}

}  // namespace

std::vector<std::string> published_wan_config_names() { return {"wan2.1-t2v-1.3b", "wan2.1-t2v-14b"}; }

json published_wan_config(const std::string& name) {
  if (name == "wan2.1-t2v-1.3b") return wan_t2v(1536, 8960, 12, 30);
  if (name == "wan2.1-t2v-14b") return wan_t2v(5120, 13824, 40, 40);
  throw ConfigError(
      fmt::format("unknown published model '{}' (valid: wan2.1-t2v-1.3b, wan2.1-t2v-14b)", name));
}

}  // namespace loom::models
