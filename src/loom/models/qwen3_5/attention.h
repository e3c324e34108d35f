// Qwen3.5's full-attention layer with HuggingFace's parameter names (self_attn.*): q_proj gives
// each head its query and an output gate side by side; q and k get per-head zero-centred RMSNorms,
// then rotary on the first rotary_dim features of each head (interleaved M-RoPE); grouped key/value
// heads; causal attention within each packed sample; the output times sigmoid(gate), then o_proj.
// And the zero-centred RMSNorm the whole stack uses, and the rotary tables.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loom/parallel/context/shard.h"
#include "loom/parallel/tensor.h"

namespace loom::models::qwen3_5 {

// Interleaved M-RoPE over the first rotary_dim features of a head (head_dim * partial_rotary_factor):
// frequency j of rotary_dim / 2 turns with the temporal position, except j = 1, 4, 7, ... below
// 3 * sections[1] with the height and j = 2, 5, 8, ... below 3 * sections[2] with the width.
struct RotaryConfig {
  double theta = 10000.0;
  int64_t rotary_dim = 0;
  std::vector<int64_t> sections;  // mrope_section: 3 entries, summing to rotary_dim / 2
};

// positions (3, T) (temporal, height, width) -> cos and sin (T, rotary_dim) in `dtype`, each the
// frequencies' angles twice over (the rotate-half layout).
std::pair<at::Tensor, at::Tensor> rotary_tables(const at::Tensor& positions, const RotaryConfig& config,
                                                at::ScalarType dtype);

// x (T, heads, head_dim): rotate-half rotary on the first cos.size(-1) features, the rest as they are.
at::Tensor apply_partial_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// x / sqrt(mean(x^2) + eps) * (1 + weight), in fp32, cast back to x's dtype once (the weight an
// offset from one; transformers' Qwen3_5RMSNorm).
at::Tensor zero_centred_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// Whole on every rank of the tensor-parallel group; its gradient is partial over the group where
// the ranks see parts of the tokens (sequence parallelism) or of the heads (options' group made
// sequence-parallel by the caller).
class ZeroCentredRMSNorm : public torch::nn::Module, public parallel::Sharded {
 public:
  ZeroCentredRMSNorm(int64_t dim, double eps, const parallel::ParamOptions& options);
  at::Tensor forward(const at::Tensor& x) const { return zero_centred_rms_norm(x, weight, eps); }
  std::map<std::string, parallel::ShardLayout> layouts() const override {
    return {{"weight", parallel::whole_layout(group_)}};
  }
  at::Tensor weight;
  double eps;

 private:
  parallel::TensorParallelGroup group_;
};

struct AttentionConfig {
  int64_t hidden_size = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  bool bias = false;  // attention_bias
  double rms_norm_eps = 1e-6;
};

// Generation's keys and values of one full-attention layer, each of `rows` samples' own (n, Hkv, D),
// the samples the first `rows` segments of a prefill's cu_seqlens or the first `rows` tokens of a
// step (LinearDecoding's layout).
struct AttentionDecoding {
  int64_t rows = 0;
  bool step = false;
  std::vector<at::Tensor> keys, values;
};

// Under tensor parallelism each rank holds its share of the query heads (each with its gate) and
// of the key/value heads (one replicated on several ranks when tp exceeds them).
class GatedAttention : public torch::nn::Module {
 public:
  GatedAttention(const AttentionConfig& config, const parallel::ParamOptions& options);
  // x (1, T, hidden), cos and sin (T, rotary_dim), packed samples [cu[i], cu[i+1]) -> (1, T, hidden).
  // `cp`: the tokens are this rank's context-parallel shard, attended as the plan says.
  // `decoding`: a prefill keeps each sample's keys and values; a step attends each row's token over its
  // row's (the tokens after the first `rows`, padding, come out as zeros).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const std::vector<int64_t>& cu_seqlens, const parallel::ContextAttention* cp = nullptr,
                     AttentionDecoding* decoding = nullptr) const;

  AttentionConfig config;
  int64_t local_heads, local_kv_heads;  // this rank's
  std::shared_ptr<parallel::ColumnParallelLinear> q_proj, k_proj, v_proj;
  std::shared_ptr<parallel::RowParallelLinear> o_proj;
  std::shared_ptr<ZeroCentredRMSNorm> q_norm, k_norm;
};

}  // namespace loom::models::qwen3_5
