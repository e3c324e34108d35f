#include "loom/models/qwen3_5/gated_deltanet.h"

#include <fmt/format.h>

#include <map>

#include "loom/dist/mappings.h"
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

LinearContextParallel linear_context_parallel(const parallel::ContextShard& shard) {
  const parallel::ContextParallelGroup& group = shard.group;
  if (group.ulysses_size != 1)
    throw ConfigError(
        "parallel.cp_ulysses: Qwen3.5's linear-attention layers run context parallelism over a ring only "
        "(cp_ulysses 1)");
  if (!shard.causal) throw ModelError("linear attention's context-parallel shard must be causal");
  LinearContextParallel plan;
  plan.ring = group.ring;
  // Every ring rank's chunks in the order its shard holds them: (sequence, chunk within it).
  const int64_t ring = group.ring_size;
  std::vector<std::vector<std::pair<size_t, int64_t>>> chunks(static_cast<size_t>(ring));
  for (int64_t r = 0; r < ring; ++r)
    for (size_t i = 0; i < shard.sequences.size(); ++i) {
      const int64_t chunk = shard.sequences[i].chunk;
      if (chunk == 0) continue;
      for (const auto& [first, length] : shard.held(i, r))
        chunks[static_cast<size_t>(r)].emplace_back(i, first / chunk);
    }
  plan.pieces = static_cast<int64_t>(chunks[0].size());
  std::map<std::pair<size_t, int64_t>, int64_t> index;
  for (int64_t r = 0; r < ring; ++r)
    for (int64_t p = 0; p < plan.pieces; ++p)
      index[chunks[static_cast<size_t>(r)][static_cast<size_t>(p)]] = r * plan.pieces + p;
  plan.cu = {0};
  for (const auto& [sequence, chunk] : chunks[static_cast<size_t>(group.ring_rank)]) {
    const int64_t length = shard.sequences[sequence].chunk;
    plan.cu.push_back(plan.cu.back() + length);
    plan.lengths.push_back(length);
    std::vector<int64_t> before;
    for (int64_t b = chunk - 1; b >= 0; --b) before.push_back(index.at({sequence, b}));
    plan.before.push_back(std::move(before));
  }
  if (plan.cu.back() < shard.local_length) plan.cu.push_back(shard.local_length);
  return plan;
}

namespace {

// Rows [end - n, end) of x for n = min(halo, length), zeros in front up to `halo` rows: the K - 1 rows
// a convolution reads before what follows a segment of `length` rows ending at `end`.
at::Tensor last_rows(const at::Tensor& x, int64_t end, int64_t length, int64_t halo) {
  const int64_t take = std::min(halo, length);
  return at::constant_pad_nd(x.narrow(0, end - take, take), {0, 0, halo - take, 0});
}

// The causal convolution over this rank's chunks, each first given the K - 1 rows before it in its
// sequence (zeros before the sequence's start) from every rank's chunks' last rows.
at::Tensor context_parallel_conv1d(const at::Tensor& x, const at::Tensor& weight,
                                   const LinearContextParallel& plan) {
  const int64_t halo = weight.size(1) - 1, channels = x.size(1), pieces = plan.pieces;
  std::vector<at::Tensor> tails;
  for (int64_t p = 0; p < pieces; ++p) tails.push_back(last_rows(x, plan.cu[p + 1], plan.lengths[p], halo));
  const at::Tensor every =
      dist::gather_from_sequence_region(pieces > 0 ? at::stack(tails) : x.new_zeros({0, halo, channels}),
                                        plan.ring, 0);  // (ring * pieces, halo, C)
  std::vector<at::Tensor> parts;
  std::vector<int64_t> cu{0};
  for (size_t s = 0; s + 1 < plan.cu.size(); ++s) {
    std::vector<at::Tensor> rows;
    int64_t have = 0;
    if (static_cast<int64_t>(s) < pieces) {
      const int64_t take = std::min(halo, plan.lengths[s]);  // the chunks of one sequence are alike
      for (int64_t before : plan.before[s]) {
        if (have >= halo) break;
        rows.insert(rows.begin(), every[before].narrow(0, halo - take, take));
        have += take;
      }
    }
    at::Tensor front = rows.empty() ? x.new_zeros({0, channels}) : at::cat(rows);
    front = have >= halo ? front.narrow(0, have - halo, halo)
                         : at::constant_pad_nd(front, {0, 0, halo - have, 0});
    const int64_t length = plan.cu[s + 1] - plan.cu[s];
    parts.push_back(front);
    parts.push_back(x.narrow(0, plan.cu[s], length));
    cu.push_back(cu.back() + halo + length);
  }
  const at::Tensor out = causal_conv1d(at::cat(parts), weight, cu);
  std::vector<at::Tensor> kept;
  for (size_t s = 0; s + 1 < cu.size(); ++s)
    kept.push_back(out.narrow(0, cu[s] + halo, cu[s + 1] - cu[s] - halo));
  return at::cat(kept);
}

using DeltaRule = kernels::DeltaRuleResult (*)(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                               const at::Tensor&, const at::Tensor&,
                                               const std::vector<int64_t>&, const at::Tensor&,
                                               kernels::DeltaRuleOptions);

// The delta rule over this rank's chunks with the states passed along the ring
// (LinearContextParallel's steps 1 to 3).
at::Tensor context_parallel_delta_rule(DeltaRule rule, const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const at::Tensor& g, const at::Tensor& beta,
                                       const LinearContextParallel& plan) {
  const int64_t tokens = v.size(0), heads = v.size(1), dk = k.size(2), dv = v.size(2);
  const int64_t segments = static_cast<int64_t>(plan.cu.size()) - 1;
  const auto f32 = v.options().dtype(at::kFloat);
  // 1. From zero states, with Dk more value columns that start as the identity and are written nothing.
  const at::Tensor extended = at::cat({v, v.new_zeros({tokens, heads, dk})}, -1);
  const at::Tensor identity = at::cat(
      {at::zeros({segments, heads, dk, dv}, f32), at::eye(dk, f32).expand({segments, heads, dk, dk})}, -1);
  const at::Tensor ends =
      rule(q, k, extended, g, beta, plan.cu, identity, {}).final_state.narrow(0, 0, plan.pieces);
  // 2. Every chunk's (S0, M) on every rank.
  const at::Tensor every = dist::gather_from_sequence_region(ends.contiguous(), plan.ring, 0);
  // 3. Each chunk's starting state, scanned over the chunks before it; then the chunks again from them.
  std::vector<at::Tensor> starts;
  for (int64_t s = 0; s < segments; ++s) {
    at::Tensor state = at::zeros({heads, dk, dv}, f32);
    if (s < plan.pieces)
      for (auto it = plan.before[s].rbegin(); it != plan.before[s].rend(); ++it) {
        const at::Tensor chunk = every[*it];
        state = at::matmul(chunk.narrow(-1, dv, dk), state) + chunk.narrow(-1, 0, dv);
      }
    starts.push_back(state);
  }
  return rule(q, k, v, g, beta, plan.cu, at::stack(starts), {}).out;
}

}  // namespace

GatedDeltaNet::GatedDeltaNet(const GatedDeltaNetConfig& c, const parallel::ParamOptions& options)
    : config(c), local(c), group_(options.tp) {
  if (c.num_value_heads % c.num_key_heads != 0)
    throw ConfigError(fmt::format("linear_num_value_heads {} is not a multiple of linear_num_key_heads {}",
                                  c.num_value_heads, c.num_key_heads));
  const int64_t tp = options.tp.size();
  local.num_key_heads =
      parallel::heads_per_rank(c.num_key_heads, tp, "tp", "Qwen3.5's", "linear-attention key heads");
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

at::Tensor GatedDeltaNet::forward(const at::Tensor& x, const std::vector<int64_t>& cu_seqlens, bool fused,
                                  const LinearContextParallel* cp, LinearDecoding* decoding) const {
  const GatedDeltaNetConfig& c = local;
  const at::Tensor entered = in_proj_qkv->group().enter(x, 1);
  const int64_t tokens = entered.size(1);
  const at::Tensor h = entered.squeeze(0);  // (T, hidden)
  // q, k and v through the convolution and SiLU, in the model's dtype.
  const at::Tensor projected = in_proj_qkv->forward(h);
  const at::Tensor weight = conv_weight.squeeze(1);  // (C, K)
  const int64_t halo = c.conv_kernel - 1;
  const bool step = decoding && decoding->step;
  at::Tensor convolved;
  if (step) {
    // One token a row after the cached rows: the window's weighted sum.
    const int64_t rows = decoding->rows;
    const at::Tensor window = at::cat({decoding->conv, projected.narrow(0, 0, rows).unsqueeze(1)}, 1);
    decoding->conv = window.narrow(1, 1, halo);
    convolved = at::constant_pad_nd((window * weight.t().unsqueeze(0)).sum(1), {0, 0, 0, tokens - rows});
  } else {
    convolved =
        cp ? context_parallel_conv1d(projected, weight, *cp) : causal_conv1d(projected, weight, cu_seqlens);
    if (decoding) {  // each sample's last K - 1 rows, zeros before a shorter one's start
      std::vector<at::Tensor> tails;
      for (int64_t s = 0; s < decoding->rows; ++s)
        tails.push_back(last_rows(projected, cu_seqlens[s + 1], cu_seqlens[s + 1] - cu_seqlens[s], halo));
      decoding->conv = at::stack(tails);
    }
  }
  const at::Tensor mixed = at::silu(convolved);
  const auto parts = mixed.split_with_sizes({c.key_dim(), c.key_dim(), c.value_dim()}, -1);
  const at::Tensor q = l2_normalize(parts[0].view({tokens, c.num_key_heads, c.key_head_dim}));
  const at::Tensor k = l2_normalize(parts[1].view({tokens, c.num_key_heads, c.key_head_dim}));
  const at::Tensor v = parts[2].view({tokens, c.num_value_heads, c.value_head_dim});
  const at::Tensor beta = at::sigmoid(in_proj_b->forward(h));
  const at::Tensor g =
      -A_log.to(at::kFloat).exp() * at::softplus(in_proj_a->forward(h).to(at::kFloat) + dt_bias);
  const auto rule = fused ? kernels::delta_rule : kernels::composite_delta_rule;
  at::Tensor core;
  if (step) {  // the recurrent single step, each row a sample from its cached state
    const int64_t rows = decoding->rows;
    std::vector<int64_t> each(static_cast<size_t>(rows + 1));
    for (int64_t r = 0; r <= rows; ++r) each[r] = r;
    const auto first = [rows](const at::Tensor& t) { return t.narrow(0, 0, rows); };
    const kernels::DeltaRuleResult result = kernels::recurrent_delta_rule(
        first(q), first(k), first(v), first(g), first(beta), each, decoding->state);
    decoding->state = result.final_state;
    core = at::constant_pad_nd(result.out, {0, 0, 0, 0, 0, tokens - rows});
  } else if (cp) {
    core = context_parallel_delta_rule(rule, q, k, v, g, beta, *cp);
  } else {
    const kernels::DeltaRuleResult result = rule(q, k, v, g, beta, cu_seqlens, {}, {});
    core = result.out;
    if (decoding) decoding->state = result.final_state.narrow(0, 0, decoding->rows);
  }
  core = core.to(x.scalar_type());
  const at::Tensor z = in_proj_z->forward(h).view({tokens, c.num_value_heads, c.value_head_dim});
  const at::Tensor normed = gated_rms_norm(core, z, norm_weight, c.rms_norm_eps);
  return out_proj->forward(normed.reshape({1, tokens, c.value_dim()}), 1);
}

}  // namespace loom::models::qwen3_5
