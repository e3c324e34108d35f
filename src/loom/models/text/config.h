// The settings of a Qwen2 / Qwen3 decoder-only language model (models/text/decoder.h), as the
// vision-language families that put one after their projector read them from config.json.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom::models {

struct TextConfig {
  int64_t vocab_size = 152064;
  int64_t hidden_size = 3584;
  int64_t intermediate_size = 18944;
  int64_t num_layers = 28;
  int64_t num_heads = 28;
  int64_t num_kv_heads = 4;
  double rms_norm_eps = 1e-6;
  double rope_theta = 1e6;
  std::vector<int64_t> mrope_section{16, 24, 24};  // M-RoPE's (Qwen2-VL); empty: 1-D rotary positions
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 32768;

  // Qwen3: config.json's head_dim (q_proj widens to num_heads * head_dim); 0: hidden_size / num_heads.
  int64_t explicit_head_dim = 0;
  bool attention_bias = true;  // q/k/v biases: Qwen2's; Qwen3's attention_bias (false in its models)
  bool qk_norm = false;        // Qwen3: an RMSNorm over each head of q and of k, before the rotary

  int64_t head_dim() const { return explicit_head_dim > 0 ? explicit_head_dim : hidden_size / num_heads; }
};

// A Qwen2 or Qwen3 language model's text_config (model_type qwen2 | qwen3; fields under `prefix`,
// e.g. "text_config.", in messages naming `source`) with 1-D rotary positions: mrope_section empty.
// Qwen2 has q/k/v biases; Qwen3 has per-head q/k norms, its own head_dim and attention_bias. The
// rotary base is rope_theta or rope_parameters.rope_theta; rope scaling other than default (and
// dynamic, which changes nothing up to max_position_embeddings: its limit, dynamic_rope_limit) and
// sliding windows are refused. tie_word_embeddings is read here too (a caller may override it from a
// top-level flag).
struct TextModelConfig {
  TextConfig text;
  std::string model_type;          // qwen2 | qwen3
  int64_t bos_token_id = 0;        // -1 when absent
  int64_t dynamic_rope_limit = 0;  // > 0: dynamic rope scaling, sequences longer than this are refused
};
TextModelConfig parse_text_model_config(const nlohmann::json& text, const std::string& source,
                                        const std::string& prefix);

}  // namespace loom::models
