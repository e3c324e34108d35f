#include "loom/models/qwen3_5/attention.h"

#include <fmt/format.h>

#include "loom/nn/attention.h"
#include "loom/util/errors.h"

namespace loom::models::qwen3_5 {

std::pair<at::Tensor, at::Tensor> rotary_tables(const at::Tensor& positions, const RotaryConfig& c,
                                                at::ScalarType dtype) {
  const int64_t half = c.rotary_dim / 2;
  if (c.rotary_dim <= 0 || c.rotary_dim % 2 != 0 || c.sections.size() != 3 ||
      c.sections[0] + c.sections[1] + c.sections[2] != half)
    throw ConfigError(
        fmt::format("rope_parameters.mrope_section must be 3 numbers summing to {} (half the "
                    "rotary dimension {})",
                    half, c.rotary_dim));
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(positions.device());
  const at::Tensor inv_freq =
      1.0 / at::pow(c.theta, at::arange(0, c.rotary_dim, 2, f32.dtype(at::kLong)).to(f32) / c.rotary_dim);
  const at::Tensor freqs = positions.to(at::kFloat).unsqueeze(-1) * inv_freq;  // (3, T, half)
  // The axis each frequency turns with: temporal, except the interleaved height and width ones.
  std::vector<int64_t> axis(half, 0);
  for (int64_t a = 1; a < 3; ++a)
    for (int64_t j = a; j < 3 * c.sections[a] && j < half; j += 3) axis[j] = a;
  const at::Tensor index = at::tensor(axis, at::TensorOptions().dtype(at::kLong)).to(positions.device());
  const at::Tensor chosen =
      freqs.gather(0, index.view({1, 1, half}).expand({1, freqs.size(1), half})).squeeze(0);
  const at::Tensor angles = at::cat({chosen, chosen}, -1);
  return {angles.cos().to(dtype), angles.sin().to(dtype)};
}

at::Tensor apply_partial_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t rd = cos.size(-1), half = rd / 2;
  const at::Tensor rot = x.narrow(-1, 0, rd), pass = x.narrow(-1, rd, x.size(-1) - rd);
  const at::Tensor rotated = at::cat({-rot.narrow(-1, half, half), rot.narrow(-1, 0, half)}, -1);
  const at::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);  // (T, 1, rd)
  return at::cat({rot * c + rotated * s, pass}, -1);
}

at::Tensor zero_centred_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor x32 = x.to(at::kFloat);
  return (x32 * at::rsqrt(x32.pow(2).mean(-1, true) + eps) * (1.0 + weight.to(at::kFloat)))
      .to(x.scalar_type());
}

ZeroCentredRMSNorm::ZeroCentredRMSNorm(int64_t dim, double eps_, const parallel::ParamOptions& options)
    : eps(eps_), group_(options.tp) {
  weight = register_parameter("weight", at::empty({dim}, options.tensor_options()));
}

GatedAttention::GatedAttention(const AttentionConfig& c, const parallel::ParamOptions& options) : config(c) {
  if (c.num_heads % c.num_kv_heads != 0)
    throw ConfigError(fmt::format("num_attention_heads {} is not a multiple of num_key_value_heads {}",
                                  c.num_heads, c.num_kv_heads));
  const int64_t tp = options.tp.size();
  local_heads = parallel::heads_per_rank(c.num_heads, tp, "tp", "Qwen3.5's", "attention heads");
  local_kv_heads = parallel::kv_heads_per_rank(c.num_kv_heads, tp, "Qwen3.5's");
  const int64_t kv_slices = std::min(c.num_kv_heads, tp);
  // q_proj's rows are each head's query then its gate, so a split by rows keeps whole heads.
  q_proj = register_module("q_proj", std::make_shared<parallel::ColumnParallelLinear>(
                                         c.hidden_size, 2 * c.num_heads * c.head_dim, c.bias, options));
  k_proj = register_module(
      "k_proj", std::make_shared<parallel::ColumnParallelLinear>(c.hidden_size, c.num_kv_heads * c.head_dim,
                                                                 c.bias, options, 1, kv_slices));
  v_proj = register_module(
      "v_proj", std::make_shared<parallel::ColumnParallelLinear>(c.hidden_size, c.num_kv_heads * c.head_dim,
                                                                 c.bias, options, 1, kv_slices));
  o_proj = register_module("o_proj", std::make_shared<parallel::RowParallelLinear>(
                                         c.num_heads * c.head_dim, c.hidden_size, c.bias, options));
  // Whole on every rank, each applied to this rank's heads: partial gradients over the group.
  parallel::ParamOptions heads = options;
  heads.tp.sequence_parallel = true;
  q_norm = register_module("q_norm", std::make_shared<ZeroCentredRMSNorm>(c.head_dim, c.rms_norm_eps, heads));
  k_norm = register_module("k_norm", std::make_shared<ZeroCentredRMSNorm>(c.head_dim, c.rms_norm_eps, heads));
}

at::Tensor GatedAttention::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                   const std::vector<int64_t>& cu_seqlens,
                                   const parallel::ContextAttention* cp, AttentionDecoding* decoding) const {
  const AttentionConfig& c = config;
  const at::Tensor h = q_proj->group().enter(x, 1).squeeze(0);  // (T, hidden)
  const int64_t tokens = h.size(0);
  // Each head's query, then its gate.
  const at::Tensor both = q_proj->forward(h).view({tokens, local_heads, 2 * c.head_dim});
  const at::Tensor gate = both.narrow(-1, c.head_dim, c.head_dim).reshape({tokens, local_heads * c.head_dim});
  at::Tensor q = q_norm->forward(both.narrow(-1, 0, c.head_dim));
  at::Tensor k = k_norm->forward(k_proj->forward(h).view({tokens, local_kv_heads, c.head_dim}));
  q = apply_partial_rotary(q, cos, sin);
  k = apply_partial_rotary(k, cos, sin);
  const at::Tensor v = v_proj->forward(h).view({tokens, local_kv_heads, c.head_dim});
  at::Tensor attended;
  if (decoding && decoding->step) {
    std::vector<at::Tensor> rows;
    for (int64_t r = 0; r < decoding->rows; ++r) {
      at::Tensor& keys = decoding->keys[r];
      at::Tensor& values = decoding->values[r];
      keys = at::cat({keys, k.narrow(0, r, 1)});
      values = at::cat({values, v.narrow(0, r, 1)});
      const at::Tensor every =
          at::ones({1, 1, keys.size(0)}, at::TensorOptions().dtype(at::kBool).device(q.device()));
      rows.push_back(
          nn::masked_attention(q.narrow(0, r, 1).unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0), every)
              .squeeze(0));
    }
    attended = at::constant_pad_nd(at::cat(rows), {0, 0, 0, 0, 0, tokens - decoding->rows});
  } else {
    attended = cp ? nn::context_attention(q, k, v, *cp)
                  : nn::segment_attention(q, k, v, cu_seqlens, /*causal=*/true);
    if (decoding) {
      decoding->keys.clear();
      decoding->values.clear();
      for (int64_t s = 0; s < decoding->rows; ++s) {
        decoding->keys.push_back(k.narrow(0, cu_seqlens[s], cu_seqlens[s + 1] - cu_seqlens[s]));
        decoding->values.push_back(v.narrow(0, cu_seqlens[s], cu_seqlens[s + 1] - cu_seqlens[s]));
      }
    }
  }
  const at::Tensor gated = attended.reshape({tokens, local_heads * c.head_dim}) * at::sigmoid(gate);
  return o_proj->forward(gated.unsqueeze(0), 1);
}

}  // namespace loom::models::qwen3_5
