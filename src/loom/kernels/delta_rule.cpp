#include "loom/kernels/delta_rule.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "loom/kernels/cpu/vector.h"
#include "loom/kernels/cuda/ops.h"
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

namespace loom::kernels {
namespace {

// The fused CPU kernel's problem: fp32 contiguous rows, the chunk checkpoints' layout.
struct FusedProblem {
  Shapes s;
  std::vector<int64_t> cu;
  std::vector<int64_t> first_chunk;  // per segment, its first checkpoint; last entry: all of them
  int64_t chunk = 64;
  float scale = 1;
};

FusedProblem fused_problem(const Shapes& s, const std::vector<int64_t>& cu_seqlens,
                           DeltaRuleOptions options) {
  FusedProblem p{s, cu_seqlens, {0}, options.chunk_size, static_cast<float>(scale_of(options, s.dk))};
  if (p.chunk < 1) throw ModelError(fmt::format("delta rule: chunk_size must be positive, got {}", p.chunk));
  for (int64_t seg = 0; seg < s.segments; ++seg) {
    const int64_t n = cu_seqlens[seg + 1] - cu_seqlens[seg];
    p.first_chunk.push_back(p.first_chunk.back() + (n + p.chunk - 1) / p.chunk);
  }
  return p;
}

// The per-token passes over one head's state S (Dk rows of Dv), vectorised along the rows (compiled
// for each vector width, cpu/vector.h).

// S = a S, read = S^T k (after the decay).
LOOM_VECTOR_CLONES void decay_and_read(float* S, int64_t dk, int64_t dv, float a, const float* k,
                                       float* read) {
  std::fill(read, read + dv, 0.f);
  for (int64_t i = 0; i < dk; ++i) {
    float* row = S + i * dv;
    const float ki = k[i];
    for (int64_t j = 0; j < dv; ++j) {
      row[j] *= a;
      read[j] += row[j] * ki;
    }
  }
}

// S += k delta^T, out = S^T q (q already scaled).
LOOM_VECTOR_CLONES void write_and_output(float* S, int64_t dk, int64_t dv, const float* k, const float* delta,
                                         const float* q, float scale, float* out) {
  std::fill(out, out + dv, 0.f);
  for (int64_t i = 0; i < dk; ++i) {
    float* row = S + i * dv;
    const float ki = k[i], qi = q[i] * scale;
    for (int64_t j = 0; j < dv; ++j) {
      row[j] += ki * delta[j];
      out[j] += row[j] * qi;
    }
  }
}

// The step recomputed for the backward pass from the state before it, Sp: u = v - a Sp^T k,
// delta = beta u, and (when next is given) the state after it, a Sp + k delta^T.
LOOM_VECTOR_CLONES void recompute_step(const float* Sp, int64_t dk, int64_t dv, float a, float b,
                                       const float* k, const float* v, float* u, float* delta, float* next) {
  std::copy(v, v + dv, u);
  for (int64_t i = 0; i < dk; ++i) {
    const float* row = Sp + i * dv;
    const float aki = a * k[i];
    for (int64_t j = 0; j < dv; ++j) u[j] -= row[j] * aki;
  }
  for (int64_t j = 0; j < dv; ++j) delta[j] = b * u[j];
  if (next)
    for (int64_t i = 0; i < dk; ++i) {
      const float* row = Sp + i * dv;
      float* out = next + i * dv;
      const float ki = k[i];
      for (int64_t j = 0; j < dv; ++j) out[j] = a * row[j] + ki * delta[j];
    }
}

// The output's and the write's gradients: with S_t = a Sp + k delta^T and o = S_t^T q (q scaled),
// dS += q dO^T (when dO is given), dq = S_t dO, ddelta = dS^T k, dk = dS delta.
LOOM_VECTOR_CLONES void output_and_write_grads(float* dS, const float* Sp, int64_t dk, int64_t dv, float a,
                                               const float* k, const float* delta, const float* q,
                                               float scale, const float* dout, float* dq, float* ddelta,
                                               float* dkey) {
  std::fill(ddelta, ddelta + dv, 0.f);
  for (int64_t i = 0; i < dk; ++i) {
    float* drow = dS + i * dv;
    const float* row = Sp + i * dv;
    const float ki = k[i];
    if (dout) {
      const float qi = q[i] * scale;
      for (int64_t j = 0; j < dv; ++j) drow[j] += qi * dout[j];
      dq[i] = scale * cpu::lane_sum(dv, [&](int64_t j) { return (a * row[j] + ki * delta[j]) * dout[j]; });
    } else {
      dq[i] = 0.f;
    }
    for (int64_t j = 0; j < dv; ++j) ddelta[j] += drow[j] * ki;
    dkey[i] = cpu::lane_sum(dv, [&](int64_t j) { return drow[j] * delta[j]; });
  }
}

// Through the decayed state P = a Sp, which reaches S_t directly and through u = v - P^T k:
// dP = dS - k du^T, dk -= P du, da = <dP, Sp>; dS becomes the gradient of Sp, a dP. Returns da.
LOOM_VECTOR_CLONES float decay_grads(float* dS, const float* Sp, int64_t dk, int64_t dv, float a,
                                     const float* k, const float* du, float* dkey) {
  float da = 0.f;
  for (int64_t i = 0; i < dk; ++i) {
    float* drow = dS + i * dv;
    const float* row = Sp + i * dv;
    const float ki = k[i];
    dkey[i] -= a * cpu::lane_sum(dv, [&](int64_t j) { return row[j] * du[j]; });
    da += cpu::lane_sum(dv, [&](int64_t j) { return (drow[j] - ki * du[j]) * row[j]; });
    for (int64_t j = 0; j < dv; ++j) drow[j] = a * (drow[j] - ki * du[j]);
  }
  return da;
}

// One value head of one segment, forward: its outputs, final state and checkpoints (the state
// before each chunk).
void forward_head(const FusedProblem& p, int64_t seg, int64_t h, const float* q, const float* k,
                  const float* v, const float* g, const float* beta, const float* state0, float* out,
                  float* final_state, float* checkpoints) {
  const Shapes& s = p.s;
  const int64_t dk = s.dk, dv = s.dv, kh = h / (s.hv / s.hk);
  std::vector<float> state(state0, state0 + dk * dv), read(dv), delta(dv);
  float* S = state.data();
  for (int64_t t = p.cu[seg], c = p.first_chunk[seg]; t < p.cu[seg + 1]; ++t) {
    if ((t - p.cu[seg]) % p.chunk == 0) std::copy(S, S + dk * dv, checkpoints + ((c++) * s.hv + h) * dk * dv);
    const float* kt = k + (t * s.hk + kh) * dk;
    const float* vt = v + (t * s.hv + h) * dv;
    const float b = beta[t * s.hv + h];
    decay_and_read(S, dk, dv, std::exp(g[t * s.hv + h]), kt, read.data());
    for (int64_t j = 0; j < dv; ++j) delta[j] = b * (vt[j] - read[j]);
    write_and_output(S, dk, dv, kt, delta.data(), q + (t * s.hk + kh) * dk, p.scale,
                     out + (t * s.hv + h) * dv);
  }
  std::copy(S, S + dk * dv, final_state);
}

// One value head of one segment, backward: reverse over its chunks, each chunk's states recomputed
// from its checkpoint. dq and dk are per value head ((T, Hv, Dk); summed over a key head's group
// afterwards); dv, dg, dbeta its own rows; dstate0 the gradient of its initial state.
void backward_head(const FusedProblem& p, int64_t seg, int64_t h, const float* q, const float* k,
                   const float* v, const float* g, const float* beta, const float* checkpoints,
                   const float* dout, const float* dfinal, float* dq, float* dk_out, float* dv_out, float* dg,
                   float* dbeta, float* dstate0) {
  const Shapes& s = p.s;
  const int64_t dk = s.dk, dv = s.dv, kh = h / (s.hv / s.hk), begin = p.cu[seg], end = p.cu[seg + 1];
  std::vector<float> dS(dk * dv, 0.f), states(p.chunk * dk * dv), deltas(p.chunk * dv), us(p.chunk * dv),
      ddelta(dv);
  if (dfinal) std::copy(dfinal, dfinal + dk * dv, dS.begin());
  for (int64_t c = p.first_chunk[seg + 1] - 1; c >= p.first_chunk[seg]; --c) {
    const int64_t c0 = begin + (c - p.first_chunk[seg]) * p.chunk, c1 = std::min(c0 + p.chunk, end);
    // Recompute the chunk: the state before each token, and each token's u and delta.
    std::copy_n(checkpoints + (c * s.hv + h) * dk * dv, dk * dv, states.begin());
    for (int64_t t = c0; t < c1; ++t) {
      const int64_t r = t - c0;
      recompute_step(states.data() + r * dk * dv, dk, dv, std::exp(g[t * s.hv + h]), beta[t * s.hv + h],
                     k + (t * s.hk + kh) * dk, v + (t * s.hv + h) * dv, us.data() + r * dv,
                     deltas.data() + r * dv, r + 1 < c1 - c0 ? states.data() + (r + 1) * dk * dv : nullptr);
    }
    for (int64_t t = c1 - 1; t >= c0; --t) {
      const int64_t r = t - c0, row = t * s.hv + h;
      const float* Sp = states.data() + r * dk * dv;
      const float* kt = k + (t * s.hk + kh) * dk;
      const float a = std::exp(g[row]), b = beta[row];
      const float* u = us.data() + r * dv;
      float* dkt = dk_out + row * dk;
      output_and_write_grads(dS.data(), Sp, dk, dv, a, kt, deltas.data() + r * dv, q + (t * s.hk + kh) * dk,
                             p.scale, dout ? dout + row * dv : nullptr, dq + row * dk, ddelta.data(), dkt);
      // delta = beta u, u = v - a Sp^T k: du = beta ddelta = dv.
      float* du = dv_out + row * dv;
      dbeta[row] = cpu::lane_sum(dv, [&](int64_t j) { return ddelta[j] * u[j]; });
      for (int64_t j = 0; j < dv; ++j) du[j] = b * ddelta[j];
      dg[row] = a * decay_grads(dS.data(), Sp, dk, dv, a, kt, du, dkt);
    }
  }
  std::copy(dS.begin(), dS.end(), dstate0);
}

// Every (segment, value head) on a thread of its own.
void forward_on_cpu(const FusedProblem& p, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& g, const at::Tensor& beta, const at::Tensor& state0, at::Tensor& out,
                    at::Tensor& final_state, at::Tensor& checkpoints) {
  const Shapes& s = p.s;
  at::parallel_for(0, s.segments * s.hv, 1, [&](int64_t first, int64_t last) {
    for (int64_t item = first; item < last; ++item) {
      const int64_t seg = item / s.hv, h = item % s.hv;
      forward_head(p, seg, h, q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                   g.data_ptr<float>(), beta.data_ptr<float>(),
                   state0.data_ptr<float>() + (seg * s.hv + h) * s.dk * s.dv, out.data_ptr<float>(),
                   final_state.data_ptr<float>() + (seg * s.hv + h) * s.dk * s.dv,
                   checkpoints.data_ptr<float>());
    }
  });
}

at::Tensor f32_contiguous(const at::Tensor& x) { return x.to(at::kFloat).contiguous(); }

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class DeltaRuleFunction : public torch::autograd::Function<DeltaRuleFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in,
                               const at::Tensor& v_in, const at::Tensor& g_in, const at::Tensor& beta_in,
                               const at::Tensor& state_in, std::vector<int64_t> cu_seqlens, double scale,
                               int64_t chunk) {
    const Shapes s = check(q_in, k_in, v_in, g_in, beta_in, cu_seqlens, state_in);
    const FusedProblem p = fused_problem(s, cu_seqlens, {scale, chunk});
    const at::Tensor q = f32_contiguous(q_in), k = f32_contiguous(k_in), v = f32_contiguous(v_in),
                     g = f32_contiguous(g_in), beta = f32_contiguous(beta_in),
                     state0 = f32_contiguous(state_in);
    const auto f32 = q.options();
    at::Tensor out, final_state, checkpoints;
    if constexpr (cuda::kBuilt) {
      if (q.is_cuda()) {
        cuda::DeltaRuleForward r =
            cuda::delta_rule_forward(q, k, v, g, beta, state0, {cu_seqlens, chunk, p.scale});
        out = r.out;
        final_state = r.final_state;
        checkpoints = r.checkpoints;
      }
    }
    if (!out.defined()) {
      out = at::empty({s.tokens, s.hv, s.dv}, f32);
      final_state = at::empty({s.segments, s.hv, s.dk, s.dv}, f32);
      checkpoints = at::empty({p.first_chunk.back(), s.hv, s.dk, s.dv}, f32);
      forward_on_cpu(p, q, k, v, g, beta, state0, out, final_state, checkpoints);
    }
    ctx->save_for_backward({q, k, v, g, beta, checkpoints});
    ctx->saved_data["cu_seqlens"] = cu_seqlens;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["types"] = std::vector<int64_t>{
        static_cast<int64_t>(q_in.scalar_type()),    static_cast<int64_t>(k_in.scalar_type()),
        static_cast<int64_t>(v_in.scalar_type()),    static_cast<int64_t>(g_in.scalar_type()),
        static_cast<int64_t>(beta_in.scalar_type()), static_cast<int64_t>(state_in.scalar_type())};
    return {out.to(v_in.scalar_type()), final_state};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &g = saved[3], &beta = saved[4],
                     &checkpoints = saved[5];
    const std::vector<int64_t> cu = ctx->saved_data["cu_seqlens"].toIntVector();
    const Shapes s{q.size(0), q.size(1), v.size(1),
                   q.size(2), v.size(2), static_cast<int64_t>(cu.size()) - 1};
    const FusedProblem p =
        fused_problem(s, cu, {ctx->saved_data["scale"].toDouble(), ctx->saved_data["chunk"].toInt()});
    const at::Tensor dout = grads[0].defined() ? f32_contiguous(grads[0]) : at::Tensor();
    const at::Tensor dfinal = grads[1].defined() ? f32_contiguous(grads[1]) : at::Tensor();
    at::Tensor dq, dk, dv, dg, dbeta, dstate0;
    if constexpr (cuda::kBuilt) {
      if (q.is_cuda()) {
        cuda::DeltaRuleGrads r =
            cuda::delta_rule_backward(q, k, v, g, beta, checkpoints, dout, dfinal, {cu, p.chunk, p.scale});
        std::tie(dq, dk, dv, dg, dbeta, dstate0) = std::tie(r.dq, r.dk, r.dv, r.dg, r.dbeta, r.dstate0);
      }
    }
    if (!dq.defined()) {
      const auto f32 = q.options();
      dq = at::zeros({s.tokens, s.hv, s.dk}, f32);
      dk = at::zeros({s.tokens, s.hv, s.dk}, f32);
      dv = at::zeros_like(v);
      dg = at::zeros_like(g);
      dbeta = at::zeros_like(beta);
      dstate0 = at::empty({s.segments, s.hv, s.dk, s.dv}, f32);
      at::parallel_for(0, s.segments * s.hv, 1, [&](int64_t first, int64_t last) {
        for (int64_t item = first; item < last; ++item) {
          const int64_t seg = item / s.hv, h = item % s.hv, state = (seg * s.hv + h) * s.dk * s.dv;
          backward_head(p, seg, h, q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                        g.data_ptr<float>(), beta.data_ptr<float>(), checkpoints.data_ptr<float>(),
                        dout.defined() ? dout.data_ptr<float>() : nullptr,
                        dfinal.defined() ? dfinal.data_ptr<float>() + state : nullptr, dq.data_ptr<float>(),
                        dk.data_ptr<float>(), dv.data_ptr<float>(), dg.data_ptr<float>(),
                        dbeta.data_ptr<float>(), dstate0.data_ptr<float>() + state);
        }
      });
      // A key head's gradient is the sum over the value heads it serves.
      const int64_t repeat = s.hv / s.hk;
      dq = dq.view({s.tokens, s.hk, repeat, s.dk}).sum(2);
      dk = dk.view({s.tokens, s.hk, repeat, s.dk}).sum(2);
    }
    const std::vector<int64_t> types = ctx->saved_data["types"].toIntVector();
    const auto as = [&](const at::Tensor& x, size_t i) {
      return x.to(static_cast<at::ScalarType>(types[i]));
    };
    return {as(dq, 0),      as(dk, 1),    as(dv, 2),    as(dg, 3),   as(dbeta, 4),
            as(dstate0, 5), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

DeltaRuleResult delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                           const at::Tensor& beta, const std::vector<int64_t>& cu_seqlens,
                           const at::Tensor& initial_state, DeltaRuleOptions options) {
  // The CPU kernel takes CPU tensors; the CUDA kernel (in a CUDA build) tensors on one GPU whose
  // heads fit its shared memory. Others get the composite.
  const auto all_on = [&](at::Device device) {
    return q.device() == device && k.device() == device && v.device() == device && g.device() == device &&
           beta.device() == device && (!initial_state.defined() || initial_state.device() == device);
  };
  const Shapes s = check(q, k, v, g, beta, cu_seqlens, initial_state);
  bool on_cuda = false;
  if constexpr (cuda::kBuilt)
    on_cuda = q.is_cuda() && all_on(q.device()) && cuda::delta_rule_fits(s.dk, s.dv, q.device());
  if (!on_cuda && !all_on(at::kCPU))
    return composite_delta_rule(q, k, v, g, beta, cu_seqlens, initial_state, options);
  const at::Tensor state0 = initial_state.defined()
                                ? initial_state
                                : at::zeros({s.segments, s.hv, s.dk, s.dv}, q.options().dtype(at::kFloat));
  auto outputs =
      DeltaRuleFunction::apply(q, k, v, g, beta, state0, cu_seqlens, options.scale, options.chunk_size);
  return {outputs[0], outputs[1]};
}

}  // namespace loom::kernels
