// The Qwen2 language model used by Qwen2-VL and Qwen2.5-VL: pre-norm decoder blocks with GQA
// attention (q/k/v bias, M-RoPE) and a SwiGLU MLP, final RMSNorm.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <vector>

#include "loom/models/qwen2_vl/config.h"
#include "loom/nn/norm.h"
#include "loom/parallel/tensor.h"

namespace loom::models {

class TextAttention : public torch::nn::Module {
 public:
  TextAttention(const TextConfig& config, const parallel::ParamOptions& options);
  // x (B, L, hidden), cos/sin (B, L, 1, head_dim) -> (B, L, hidden). Causal over each row, or,
  // with cu_seqlens, over each packed sample [cu[i], cu[i+1]) of a single row (B = 1).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const std::vector<int64_t>& cu_seqlens = {}) const;
  std::shared_ptr<parallel::ColumnParallelLinear> q_proj, k_proj, v_proj;
  std::shared_ptr<parallel::RowParallelLinear> o_proj;
  int64_t num_heads, num_kv_heads, head_dim;
};

class TextMlp : public torch::nn::Module {
 public:
  TextMlp(const TextConfig& config, const parallel::ParamOptions& options);
  at::Tensor forward(const at::Tensor& x) const;  // (..., hidden) -> (..., hidden)
  std::shared_ptr<parallel::ColumnParallelLinear> gate_proj, up_proj;
  std::shared_ptr<parallel::RowParallelLinear> down_proj;
};

class DecoderLayer : public torch::nn::Module {
 public:
  DecoderLayer(const TextConfig& config, const parallel::ParamOptions& options);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const std::vector<int64_t>& cu_seqlens = {}) const;
  std::shared_ptr<nn::RMSNorm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<TextAttention> self_attn;
  std::shared_ptr<TextMlp> mlp;
};

// model.* in HuggingFace names: embed_tokens, layers, norm. Its forward pass is the model's
// language layers (layers.h).
class TextModel : public torch::nn::Module {
 public:
  TextModel(const TextConfig& config, const parallel::ParamOptions& options);
  std::shared_ptr<parallel::VocabParallelEmbedding> embed_tokens;
  std::vector<std::shared_ptr<DecoderLayer>> layers;
  std::shared_ptr<nn::RMSNorm> norm;
  TextConfig config;
  parallel::TensorParallelGroup tp;  // the LLM's; with sequence_parallel, blocks see one chunk of the tokens
};

}  // namespace loom::models
