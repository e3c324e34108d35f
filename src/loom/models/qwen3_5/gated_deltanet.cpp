#include "loom/models/qwen3_5/gated_deltanet.h"

#include <fmt/format.h>

#include "loom/kernels/delta_rule.h"
#include "loom/util/errors.h"

namespace loom::models::qwen3_5 {

at::Tensor causal_conv1d(const at::Tensor& x, const at::Tensor& weight,
                         const std::vector<int64_t>& cu_seqlens) {
  const int64_t tokens = x.size(0), kernel = weight.size(1);
  // Each token's position in its sample: a shift of s rows reaches back into the sample only from
  // position s on.
  std::vector<int64_t> position(tokens);
  for (size_t seg = 0; seg + 1 < cu_seqlens.size(); ++seg)
    for (int64_t t = cu_seqlens[seg]; t < cu_seqlens[seg + 1]; ++t) position[t] = t - cu_seqlens[seg];
  const at::Tensor positions = at::tensor(position, at::TensorOptions().dtype(at::kLong)).to(x.device());
  at::Tensor out = x * weight.select(1, kernel - 1);
  for (int64_t shift = 1; shift < kernel && shift < tokens; ++shift) {
    const at::Tensor shifted = at::constant_pad_nd(x.narrow(0, 0, tokens - shift), {0, 0, shift, 0});
    const at::Tensor inside = (positions >= shift).unsqueeze(1).to(x.scalar_type());
    out = out + shifted * inside * weight.select(1, kernel - 1 - shift);
  }
  return out;
}

at::Tensor gated_rms_norm(const at::Tensor& x, const at::Tensor& z, const at::Tensor& weight, double eps) {
  const at::Tensor x32 = x.to(at::kFloat);
  const at::Tensor normed = (x32 * at::rsqrt(x32.pow(2).mean(-1, true) + eps)).to(x.scalar_type());
  return ((weight * normed).to(at::kFloat) * at::silu(z.to(at::kFloat))).to(x.scalar_type());
}

at::Tensor l2_normalize(const at::Tensor& x, double eps) {
  const at::Tensor x32 = x.to(at::kFloat);
  return x32 * at::rsqrt(x32.pow(2).sum(-1, true) + eps);
}

GatedDeltaNet::GatedDeltaNet(const GatedDeltaNetConfig& c, const parallel::ParamOptions& options)
    : config(c), local(c), group_(options.tp) {
  if (c.num_value_heads % c.num_key_heads != 0)
    throw ConfigError(fmt::format("linear_num_value_heads {} is not a multiple of linear_num_key_heads {}",
                                  c.num_value_heads, c.num_key_heads));
  const int64_t tp = options.tp.size();
  if (c.num_key_heads % tp != 0)
    throw ConfigError(
        fmt::format("parallel.tp={}: Qwen3.5's {} linear-attention key heads do not split evenly over the "
                    "tensor-parallel ranks",
                    tp, c.num_key_heads));
  local.num_key_heads = c.num_key_heads / tp;
  local.num_value_heads = c.num_value_heads / tp;
  const std::vector<int64_t> qkv{c.key_dim(), c.key_dim(), c.value_dim()};
  in_proj_qkv = register_module(
      "in_proj_qkv", std::make_shared<parallel::ColumnParallelLinear>(c.hidden_size, qkv, false, options));
  in_proj_z = register_module("in_proj_z", std::make_shared<parallel::ColumnParallelLinear>(
                                               c.hidden_size, c.value_dim(), false, options));
  in_proj_b = register_module("in_proj_b", std::make_shared<parallel::ColumnParallelLinear>(
                                               c.hidden_size, c.num_value_heads, false, options));
  in_proj_a = register_module("in_proj_a", std::make_shared<parallel::ColumnParallelLinear>(
                                               c.hidden_size, c.num_value_heads, false, options));
  conv1d = register_module("conv1d", std::make_shared<parallel::ShardedWeight>(
                                         at::IntArrayRef{local.conv_dim(), 1, c.conv_kernel},
                                         parallel::sections_layout(options.tp, 0, qkv), options));
  conv_weight = conv1d->weight;
  dt_bias = register_parameter("dt_bias", at::empty({local.num_value_heads}, options.tensor_options()));
  A_log = register_parameter("A_log", at::empty({local.num_value_heads}, options.tensor_options()));
  // Whole, applied to this rank's heads: partial gradients over the group.
  parallel::TensorParallelGroup heads = options.tp;
  heads.sequence_parallel = true;
  norm =
      register_module("norm", std::make_shared<parallel::ShardedWeight>(
                                  at::IntArrayRef{c.value_head_dim}, parallel::whole_layout(heads), options));
  norm_weight = norm->weight;
  out_proj = register_module("out_proj", std::make_shared<parallel::RowParallelLinear>(
                                             c.value_dim(), c.hidden_size, false, options));
}

std::map<std::string, parallel::ShardLayout> GatedDeltaNet::layouts() const {
  return {{"A_log", parallel::split_layout(group_, 0)}, {"dt_bias", parallel::split_layout(group_, 0)}};
}

at::Tensor GatedDeltaNet::forward(const at::Tensor& x, const std::vector<int64_t>& cu_seqlens,
                                  bool fused) const {
  const GatedDeltaNetConfig& c = local;
  const at::Tensor rows = in_proj_qkv->group().enter(x, 1);
  const int64_t tokens = rows.size(1);
  const at::Tensor h = rows.squeeze(0);  // (T, hidden)
  // q, k and v through the convolution and SiLU, in the model's dtype.
  const at::Tensor mixed =
      at::silu(causal_conv1d(in_proj_qkv->forward(h), conv_weight.squeeze(1), cu_seqlens));
  const auto parts = mixed.split_with_sizes({c.key_dim(), c.key_dim(), c.value_dim()}, -1);
  const at::Tensor q = l2_normalize(parts[0].view({tokens, c.num_key_heads, c.key_head_dim}));
  const at::Tensor k = l2_normalize(parts[1].view({tokens, c.num_key_heads, c.key_head_dim}));
  const at::Tensor v = parts[2].view({tokens, c.num_value_heads, c.value_head_dim});
  const at::Tensor beta = at::sigmoid(in_proj_b->forward(h));
  const at::Tensor g =
      -A_log.to(at::kFloat).exp() * at::softplus(in_proj_a->forward(h).to(at::kFloat) + dt_bias);
  const auto rule = fused ? kernels::delta_rule : kernels::composite_delta_rule;
  const at::Tensor core = rule(q, k, v, g, beta, cu_seqlens, {}, {}).out.to(x.scalar_type());
  const at::Tensor z = in_proj_z->forward(h).view({tokens, c.num_value_heads, c.value_head_dim});
  const at::Tensor normed = gated_rms_norm(core, z, norm_weight, c.rms_norm_eps);
  return out_proj->forward(normed.reshape({1, tokens, c.value_dim()}), 1);
}

}  // namespace loom::models::qwen3_5
