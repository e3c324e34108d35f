// The Qwen2 / Qwen3 language model of the vision-language families: pre-norm decoder blocks with GQA
// attention (q/k/v biases for Qwen2, per-head q/k RMSNorm for Qwen3; the rotary tables, M-RoPE or 1-D,
// are the caller's) and a SwiGLU MLP, final RMSNorm.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <vector>

#include "loom/models/text/config.h"
#include "loom/nn/norm.h"
#include "loom/parallel/tensor.h"

namespace loom::models {

// What incremental decoding keeps between forward passes (HF's past_key_values): every language
// layer's keys and values of the tokens seen so far (this rank's heads, whole sequences), and which
// of those tokens are real (left padding is not).
struct KVCache {
  std::vector<at::Tensor> keys, values;  // per layer: (B, cached, kv heads, head_dim); empty at first
  at::Tensor valid;                      // (B, cached) bool; undefined at first
  int64_t length() const { return valid.defined() ? valid.size(1) : 0; }
};

// One forward pass over a cache: each layer appends the first `appended` new tokens' keys and values
// (the rest are sequence-parallel padding) to the cache's, then the queries attend where `allowed`
// (B, new tokens, cached + appended) says.
struct CachedPass {
  KVCache* cache = nullptr;
  at::Tensor allowed;
  int64_t appended = 0;
};

class TextAttention : public torch::nn::Module {
 public:
  TextAttention(const TextConfig& config, const parallel::ParamOptions& options);
  // x (B, L, hidden), cos/sin (B, L, 1, head_dim) -> (B, L, hidden). Causal over each row, or,
  // with cu_seqlens, over each packed sample [cu[i], cu[i+1]) of a single row (B = 1), or, with a
  // cached pass, over the cache as layer `layer` of the model, or, under context parallelism (x this
  // rank's shard of the tokens, one row), as `context_parallel` says.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const std::vector<int64_t>& cu_seqlens = {}, const CachedPass* cached = nullptr,
                     size_t layer = 0, const parallel::ContextAttention* context_parallel = nullptr) const;
  std::shared_ptr<parallel::ColumnParallelLinear> q_proj, k_proj, v_proj;
  std::shared_ptr<parallel::RowParallelLinear> o_proj;
  std::shared_ptr<nn::RMSNorm> q_norm, k_norm;  // qk_norm only
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
                     const std::vector<int64_t>& cu_seqlens = {}, const CachedPass* cached = nullptr,
                     size_t layer = 0, const parallel::ContextAttention* context_parallel = nullptr) const;
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

// The language model's head (lm_head), untied: over whole sequences (after the final norm), this
// rank's slice of the vocabulary. Null when the config ties it to the embedding.
std::shared_ptr<parallel::ColumnParallelLinear> make_lm_head(const TextConfig& config,
                                                             const parallel::ParamOptions& options);
// The head's weight (vocab / tp, hidden): `lm_head`'s, or the embedding's when it is null (tied).
const at::Tensor& head_weight(const TextModel& text, const parallel::ColumnParallelLinear* lm_head);
// (..., hidden) -> (..., vocab / tp), this rank's slice (every rank multiplies the whole hidden
// states by its vocabulary rows); whole_head_logits gathers the slices.
at::Tensor head_logits(const TextModel& text, const parallel::ColumnParallelLinear* lm_head,
                       const at::Tensor& hidden);
at::Tensor whole_head_logits(const TextModel& text, const parallel::ColumnParallelLinear* lm_head,
                             const at::Tensor& hidden);

}  // namespace loom::models
