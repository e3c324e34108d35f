#include "loom/kernels/delta_rule.h"

#include <fmt/format.h>

#include <cmath>

#include "loom/util/errors.h"

namespace loom::kernels {
namespace {

using at::indexing::Slice;

struct Shapes {
  int64_t tokens, hk, hv, dk, dv, segments;
};

Shapes check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
             const at::Tensor& beta, const std::vector<int64_t>& cu_seqlens,
             const at::Tensor& initial_state) {
  if (q.dim() != 3 || k.sizes() != q.sizes() || v.dim() != 3 || v.size(0) != q.size(0))
    throw ModelError(
        fmt::format("delta rule: q and k must be (T, Hk, Dk) and v (T, Hv, Dv), got [{}], [{}] and [{}]",
                    fmt::join(q.sizes(), ", "), fmt::join(k.sizes(), ", "), fmt::join(v.sizes(), ", ")));
  const Shapes s{q.size(0), q.size(1), v.size(1),
                 q.size(2), v.size(2), static_cast<int64_t>(cu_seqlens.size()) - 1};
  if (s.hv % s.hk != 0)
    throw ModelError(
        fmt::format("delta rule: {} value heads are not a multiple of {} key heads", s.hv, s.hk));
  for (const at::Tensor* t : {&g, &beta})
    if (t->dim() != 2 || t->size(0) != s.tokens || t->size(1) != s.hv)
      throw ModelError(fmt::format("delta rule: g and beta must be (T, Hv) = ({}, {}), got [{}]", s.tokens,
                                   s.hv, fmt::join(t->sizes(), ", ")));
  if (s.segments < 1 || cu_seqlens.front() != 0 || cu_seqlens.back() != s.tokens)
    throw ModelError(fmt::format("delta rule: cu_seqlens must run from 0 to {} tokens", s.tokens));
  for (int64_t i = 0; i < s.segments; ++i)
    if (cu_seqlens[i + 1] < cu_seqlens[i]) throw ModelError("delta rule: cu_seqlens must not decrease");
  if (initial_state.defined() && initial_state.sizes() != at::IntArrayRef({s.segments, s.hv, s.dk, s.dv}))
    throw ModelError(fmt::format("delta rule: the initial state must be ({}, {}, {}, {}), got [{}]",
                                 s.segments, s.hv, s.dk, s.dv, fmt::join(initial_state.sizes(), ", ")));
  return s;
}

// One segment's rows as (Hv, n, D) fp32, key heads repeated to the value heads.
at::Tensor heads_first(const at::Tensor& x, int64_t begin, int64_t end, int64_t repeat) {
  at::Tensor rows = x.slice(0, begin, end).to(at::kFloat);
  if (repeat > 1) rows = rows.repeat_interleave(repeat, 1);
  return rows.transpose(0, 1);
}

double scale_of(const DeltaRuleOptions& options, int64_t dk) {
  return options.scale > 0 ? options.scale : 1.0 / std::sqrt(static_cast<double>(dk));
}

}  // namespace

DeltaRuleResult composite_delta_rule(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                     const at::Tensor& g_in, const at::Tensor& beta_in,
                                     const std::vector<int64_t>& cu_seqlens, const at::Tensor& initial_state,
                                     DeltaRuleOptions options) {
  const Shapes s = check(q_in, k_in, v_in, g_in, beta_in, cu_seqlens, initial_state);
  const int64_t C = options.chunk_size, repeat = s.hv / s.hk;
  const double scale = scale_of(options, s.dk);
  const auto f32 = q_in.options().dtype(at::kFloat);
  const at::Tensor upper = at::ones({C, C}, f32.dtype(at::kBool)).triu(1);
  std::vector<at::Tensor> outs, finals;
  for (int64_t seg = 0; seg < s.segments; ++seg) {
    const int64_t begin = cu_seqlens[seg], n = cu_seqlens[seg + 1] - begin;
    at::Tensor state =
        initial_state.defined() ? initial_state[seg].to(at::kFloat) : at::zeros({s.hv, s.dk, s.dv}, f32);
    if (n == 0) {
      finals.push_back(state);
      continue;
    }
    const int64_t pad = (C - n % C) % C, chunks = (n + pad) / C;
    // (Hv, chunks, C, D), padded with zero rows (which neither write nor decay the state).
    const auto chunked = [&](at::Tensor x) {
      return at::constant_pad_nd(x, {0, 0, 0, pad}).reshape({s.hv, chunks, C, x.size(-1)});
    };
    at::Tensor q = heads_first(q_in, begin, begin + n, repeat) * scale;
    at::Tensor k = heads_first(k_in, begin, begin + n, repeat);
    at::Tensor v = heads_first(v_in, begin, begin + n, 1);
    at::Tensor beta = beta_in.slice(0, begin, begin + n).to(at::kFloat).transpose(0, 1);  // (Hv, n)
    at::Tensor g = g_in.slice(0, begin, begin + n).to(at::kFloat).transpose(0, 1);
    beta = at::constant_pad_nd(beta, {0, pad}).reshape({s.hv, chunks, C});
    g = at::constant_pad_nd(g, {0, pad}).reshape({s.hv, chunks, C});
    q = chunked(q);
    k = chunked(k);
    v = chunked(v);
    const at::Tensor k_beta = k * beta.unsqueeze(-1), v_beta = v * beta.unsqueeze(-1);
    const at::Tensor cum = g.cumsum(-1);  // log of the decay from the chunk's start to each position
    // decay[i][j] = exp(cum_i - cum_j) for j <= i, 0 above the diagonal.
    const at::Tensor decay = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(upper, -INFINITY).exp();
    const at::Tensor system = at::matmul(k_beta, k.transpose(-1, -2)) * decay;
    const at::Tensor intra = at::matmul(q, k.transpose(-1, -2)) * decay;
    // The UT transform: (I + strictly-lower part of system)^-1 applied to the chunk's writes.
    const at::Tensor lower = system.tril(-1) + at::eye(C, f32);
    const at::Tensor new_values = at::linalg_solve_triangular(lower, v_beta, /*upper=*/false, /*left=*/true,
                                                              /*unitriangular=*/true);
    const at::Tensor k_cumdecay = at::linalg_solve_triangular(lower, k_beta * cum.exp().unsqueeze(-1),
                                                              /*upper=*/false, /*left=*/true,
                                                              /*unitriangular=*/true);
    const at::Tensor q_decayed = q * cum.exp().unsqueeze(-1);
    const at::Tensor last = cum.narrow(-1, C - 1, 1);  // (Hv, chunks, 1)
    const at::Tensor k_decayed = k * (last - cum).exp().unsqueeze(-1);
    const at::Tensor chunk_decay = last.exp().unsqueeze(-1);  // (Hv, chunks, 1, 1)
    std::vector<at::Tensor> chunk_out;
    for (int64_t c = 0; c < chunks; ++c) {
      const at::Tensor v_new = new_values.select(1, c) - at::matmul(k_cumdecay.select(1, c), state);
      chunk_out.push_back(at::matmul(q_decayed.select(1, c), state) + at::matmul(intra.select(1, c), v_new));
      state = state * chunk_decay.select(1, c) + at::matmul(k_decayed.select(1, c).transpose(-1, -2), v_new);
    }
    outs.push_back(at::cat(chunk_out, 1).narrow(1, 0, n).transpose(0, 1));  // (n, Hv, Dv)
    finals.push_back(state);
  }
  at::Tensor out = outs.empty() ? at::zeros({0, s.hv, s.dv}, f32) : at::cat(outs, 0);
  return {out.to(v_in.scalar_type()), at::stack(finals)};
}

DeltaRuleResult recurrent_delta_rule(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                     const at::Tensor& g_in, const at::Tensor& beta_in,
                                     const std::vector<int64_t>& cu_seqlens, const at::Tensor& initial_state,
                                     DeltaRuleOptions options) {
  const Shapes s = check(q_in, k_in, v_in, g_in, beta_in, cu_seqlens, initial_state);
  const int64_t repeat = s.hv / s.hk;
  const double scale = scale_of(options, s.dk);
  const auto f32 = q_in.options().dtype(at::kFloat);
  const at::Tensor q_all = (q_in.to(at::kFloat) * scale).repeat_interleave(repeat, 1);
  const at::Tensor k_all = k_in.to(at::kFloat).repeat_interleave(repeat, 1);
  const at::Tensor v_all = v_in.to(at::kFloat), g_all = g_in.to(at::kFloat),
                   beta_all = beta_in.to(at::kFloat);
  std::vector<at::Tensor> outs, finals;
  for (int64_t seg = 0; seg < s.segments; ++seg) {
    at::Tensor state =
        initial_state.defined() ? initial_state[seg].to(at::kFloat) : at::zeros({s.hv, s.dk, s.dv}, f32);
    for (int64_t t = cu_seqlens[seg]; t < cu_seqlens[seg + 1]; ++t) {
      const at::Tensor kt = k_all[t].unsqueeze(-1);  // (Hv, Dk, 1)
      state = state * g_all[t].exp().view({s.hv, 1, 1});
      const at::Tensor remembered = (state * kt).sum(1);  // (Hv, Dv)
      const at::Tensor delta = (v_all[t] - remembered) * beta_all[t].unsqueeze(-1);
      state = state + kt * delta.unsqueeze(1);
      outs.push_back((state * q_all[t].unsqueeze(-1)).sum(1));
    }
    finals.push_back(state);
  }
  at::Tensor out = outs.empty() ? at::zeros({0, s.hv, s.dv}, f32) : at::stack(outs);
  return {out.to(v_in.scalar_type()), at::stack(finals)};
}

}  // namespace loom::kernels
