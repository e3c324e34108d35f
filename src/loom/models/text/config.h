// The settings of a Qwen2 / Qwen3 decoder-only language model (models/text/decoder.h), as the
// vision-language families that put one after their projector read them from config.json.
#pragma once
#include <cstdint>
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

}  // namespace loom::models
