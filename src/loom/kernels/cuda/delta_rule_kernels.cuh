// Device code of the gated delta rule (kernels/delta_rule.h), forward and backward: only simt.h
// primitives, no ATen, so it also runs under the CPU emulator. Host wrappers: delta_rule.cu.
//
// One block per (segment, value head), one thread per column j of the state S (Dk x Dv, fp32, in
// shared memory). The recurrence is column-wise: column j of S_t depends only on column j of
// S_{t-1}, on k_t and on v_t[j], so the forward pass needs a barrier only to share each token's k
// and q. Per token and column, with a = exp(g_t), b = beta_t:
//   S = a S;  u = v_j - S^T k;  S += k (b u);  o_j = scale S^T q.
// The state before every `chunk`-th token is saved (checkpoints, (chunks, Hv, Dk, Dv)).
//
// The backward pass runs a segment's chunks in reverse. It recomputes a chunk from its checkpoint
// twice, sqrt-style: once keeping the state before every `span`-th token, then each span of tokens
// again (last first) keeping every state before a token, so a block's scratch is chunk/span + span
// states rather than chunk. Per token, in reverse, with dS the gradient of S_t:
//   columns: dS += q dO^T,  ddelta = dS^T k,  du = b ddelta (= dv),  dbeta = <ddelta, u>
//   rows:    dq = scale (a Sp + k delta^T) dO,  dk = dS delta - a Sp du,  da = <dS - k du^T, Sp>
//   columns: dS = a (dS - k du^T)   (the gradient of Sp, the state before the token)
// Rows read across columns, so S and dS live in shared memory with an odd row stride (no bank
// conflicts either way), and the phases are separated by barriers. Sums over a block (dbeta, da) go
// through warp shuffles and one slot per warp, in a fixed order: the result is deterministic.
#pragma once
#include <cstdint>

#include "loom/kernels/cuda/namespace.h"
#include "loom/kernels/cuda/simt.h"

namespace LOOM_CUDA_NAMESPACE::delta {

using simt::kWarp;

// The problem: fp32 contiguous rows, q and k (T, Hk, Dk), v (T, Hv, Dv), g and beta (T, Hv);
// segment s spans tokens [cu[s], cu[s + 1]) and its first checkpoint is first_chunk[s].
struct Problem {
  const float *q, *k, *v, *g, *beta;
  const int64_t *cu, *first_chunk;
  int64_t hk, hv, dk, dv, chunk;
  float scale;
};

// The shared-memory row stride: odd, so that a warp reading down a column or along a row touches
// 32 different banks.
constexpr int64_t row_stride(int64_t dv) { return dv % 2 == 1 ? dv : dv + 1; }

// Sizes, for the host and the kernels (constexpr: callable on both sides). Shared floats of each
// kernel's block:
constexpr int64_t forward_shared_floats(int64_t dk, int64_t dv) { return dk * row_stride(dv) + 2 * dk; }
constexpr int64_t backward_shared_floats(int64_t dk, int64_t dv) {
  return 2 * dk * row_stride(dv) + 2 * dk + 3 * dv + 2 * kWarp;
}

// Threads of a block: one per column, a whole number of warps; at most kMaxThreads (a multiprocessor's
// registers hold a block of the backward pass at up to 128 registers a thread).
constexpr int kMaxThreads = 512;
constexpr int threads_for(int64_t dv) { return static_cast<int>((dv + kWarp - 1) / kWarp * kWarp); }

// The block's share of loading one token's key and (scaled) query rows into shared memory.
LOOM_DEVICE void load_key_query(const Problem& p, int64_t t, int64_t kh, float* kv, float* qv) {
  for (int64_t i = simt::thread_id(); i < p.dk; i += simt::block_threads()) {
    kv[i] = p.k[(t * p.hk + kh) * p.dk + i];
    if (qv) qv[i] = p.scale * p.q[(t * p.hk + kh) * p.dk + i];
  }
}

// One token on column j of S (row stride ld): S = a S, u = v_j - S^T k, S += k (b u); returns u.
// With qv, *out = S^T qv after the write.
LOOM_DEVICE float advance(float* S, int64_t ld, int64_t dk, int64_t j, float a, float b, float vj,
                          const float* kv, const float* qv, float* out) {
  float read = 0;
  for (int64_t i = 0; i < dk; ++i) {
    const float s = a * S[i * ld + j];
    S[i * ld + j] = s;
    read += s * kv[i];
  }
  const float u = vj - read, delta = b * u;
  if (qv) {
    float o = 0;
    for (int64_t i = 0; i < dk; ++i) {
      const float s = S[i * ld + j] + kv[i] * delta;
      S[i * ld + j] = s;
      o += s * qv[i];
    }
    *out = o;
  } else {
    for (int64_t i = 0; i < dk; ++i) S[i * ld + j] += kv[i] * delta;
  }
  return u;
}

// Column j between shared S (stride ld) and a dense (Dk, Dv) state in global memory.
LOOM_DEVICE void load_column(float* S, int64_t ld, const float* from, int64_t dk, int64_t dv, int64_t j) {
  for (int64_t i = 0; i < dk; ++i) S[i * ld + j] = from[i * dv + j];
}
LOOM_DEVICE void store_column(const float* S, int64_t ld, float* to, int64_t dk, int64_t dv, int64_t j) {
  for (int64_t i = 0; i < dk; ++i) to[i * dv + j] = S[i * ld + j];
}

// Grid: one block per (segment, value head), item = segment * Hv + head; threads_for(Dv) threads.
// state0 and final_state (segments, Hv, Dk, Dv); out (T, Hv, Dv).
LOOM_KERNEL void LOOM_LAUNCH_BOUNDS(kMaxThreads, 1)
    delta_rule_forward_kernel(Problem p, const float* state0, float* out, float* final_state,
                              float* checkpoints) {
  const int64_t item = simt::block_index().x, seg = item / p.hv, h = item % p.hv, kh = h / (p.hv / p.hk);
  const int64_t ld = row_stride(p.dv), j = simt::thread_id(), state = item * p.dk * p.dv;
  const bool column = j < p.dv;
  float* S = reinterpret_cast<float*>(simt::dynamic_shared());
  float* kv = S + p.dk * ld;
  float* qv = kv + p.dk;
  if (column) load_column(S, ld, state0 + state, p.dk, p.dv, j);
  const int64_t begin = p.cu[seg], end = p.cu[seg + 1];
  for (int64_t t = begin, c = p.first_chunk[seg]; t < end; ++t) {
    load_key_query(p, t, kh, kv, qv);
    simt::sync_threads();
    const bool checkpoint = (t - begin) % p.chunk == 0;
    if (column) {
      if (checkpoint) store_column(S, ld, checkpoints + (c * p.hv + h) * p.dk * p.dv, p.dk, p.dv, j);
      const int64_t row = t * p.hv + h;
      float o = 0;
      advance(S, ld, p.dk, j, simt::exp(p.g[row]), p.beta[row], p.v[row * p.dv + j], kv, qv, &o);
      out[row * p.dv + j] = o;
    }
    if (checkpoint) ++c;
    simt::sync_threads();  // kv and qv are read by every column before the next token's load
  }
  if (column) store_column(S, ld, final_state + state, p.dk, p.dv, j);
}

// Scratch floats of one resident block of the backward pass.
constexpr int64_t backward_scratch_floats(int64_t dk, int64_t dv, int64_t chunk, int64_t span) {
  return ((chunk + span - 1) / span + span) * dk * dv + span * dv;
}

// The gradients of one token (reverse order), given the state before it (states, dense) and its u;
// dS in shared memory is the gradient of S_t on entry and of S_{t-1} on return.
struct Grads {
  const float *dout, *dfinal;
  float *dq, *dkey, *dvalue, *dg, *dbeta, *dstate0;
};

LOOM_DEVICE void token_backward(const Problem& p, const Grads& d, int64_t t, int64_t h, int64_t kh,
                                const float* state_before, float u_j, float* Sp, float* dS, float* kv,
                                float* qv, float* dO, float* dl, float* du, float* parts) {
  const int64_t ld = row_stride(p.dv), dk = p.dk, dv = p.dv, row = t * p.hv + h;
  const int tid = simt::thread_id(), threads = simt::block_threads(), warps = threads / kWarp;
  const int64_t j = tid;
  const bool column = j < dv;
  const float a = simt::exp(p.g[row]), b = p.beta[row];
  load_key_query(p, t, kh, kv, qv);
  if (column) {
    load_column(Sp, ld, state_before, dk, dv, j);
    dO[j] = d.dout ? d.dout[row * dv + j] : 0.0F;
  }
  simt::sync_threads();
  // Columns: dS += q dO^T, ddelta = dS^T k, du = b ddelta.
  float beta_part = 0;
  if (column) {
    const float o = dO[j];
    float ddelta = 0;
    for (int64_t i = 0; i < dk; ++i) {
      const float x = dS[i * ld + j] + qv[i] * o;
      dS[i * ld + j] = x;
      ddelta += x * kv[i];
    }
    dl[j] = b * u_j;
    du[j] = b * ddelta;
    d.dvalue[row * dv + j] = b * ddelta;
    beta_part = ddelta * u_j;
  }
  beta_part = simt::group_sum<kWarp>(beta_part);
  if (tid % kWarp == 0) parts[tid / kWarp] = beta_part;
  simt::sync_threads();
  // Rows: dq, dk, and this thread's share of da.
  if (tid == 0) {
    float total = 0;
    for (int w = 0; w < warps; ++w) total += parts[w];
    d.dbeta[row] = total;
  }
  float a_part = 0;
  for (int64_t i = tid; i < dk; i += threads) {
    const float ki = kv[i];
    float dq = 0, dkey = 0;
    for (int64_t c = 0; c < dv; ++c) {
      const float sp = Sp[i * ld + c], ds = dS[i * ld + c];
      dq += (a * sp + ki * dl[c]) * dO[c];
      dkey += ds * dl[c] - a * sp * du[c];
      a_part += (ds - ki * du[c]) * sp;
    }
    d.dq[row * dk + i] = p.scale * dq;
    d.dkey[row * dk + i] = dkey;
  }
  a_part = simt::group_sum<kWarp>(a_part);
  if (tid % kWarp == 0) parts[kWarp + tid / kWarp] = a_part;
  simt::sync_threads();
  // Columns: dS becomes the gradient of the state before the token.
  if (tid == 0) {
    float total = 0;
    for (int w = 0; w < warps; ++w) total += parts[kWarp + w];
    d.dg[row] = a * total;
  }
  if (column)
    for (int64_t i = 0; i < dk; ++i) dS[i * ld + j] = a * (dS[i * ld + j] - kv[i] * du[j]);
  simt::sync_threads();  // the shared rows are read by every thread before the next token's load
}

// Grid: any number of blocks, each taking items (segment * Hv + head) block, block + grid, ...;
// threads_for(Dv) threads; scratch: backward_scratch_floats per block. dq and dk are per value
// head, (T, Hv, Dk); dv (T, Hv, Dv); dg, dbeta (T, Hv); dstate0 (segments, Hv, Dk, Dv). dout and
// dfinal may be null (zero).
LOOM_KERNEL void LOOM_LAUNCH_BOUNDS(kMaxThreads, 1)
    delta_rule_backward_kernel(Problem p, Grads d, const float* checkpoints, int64_t items, int64_t span,
                               float* scratch) {
  const int64_t ld = row_stride(p.dv), dk = p.dk, dv = p.dv, j = simt::thread_id(), size = dk * dv;
  const bool column = j < dv;
  float* Sp = reinterpret_cast<float*>(simt::dynamic_shared());
  float* dS = Sp + dk * ld;
  float* kv = dS + dk * ld;
  float* qv = kv + dk;
  float* dO = qv + dk;
  float* dl = dO + dv;
  float* du = dl + dv;
  float* parts = du + dv;
  const int64_t spans_per_chunk = (p.chunk + span - 1) / span;
  float* subs = scratch + simt::block_index().x * backward_scratch_floats(dk, dv, p.chunk, span);
  float* states = subs + spans_per_chunk * size;
  float* us = states + span * size;
  for (int64_t item = simt::block_index().x; item < items; item += simt::grid_size().x) {
    const int64_t seg = item / p.hv, h = item % p.hv, kh = h / (p.hv / p.hk);
    const int64_t begin = p.cu[seg], end = p.cu[seg + 1];
    if (column) {
      for (int64_t i = 0; i < dk; ++i) dS[i * ld + j] = d.dfinal ? d.dfinal[item * size + i * dv + j] : 0.0F;
    }
    for (int64_t c = p.first_chunk[seg + 1] - 1; c >= p.first_chunk[seg]; --c) {
      const int64_t c0 = begin + (c - p.first_chunk[seg]) * p.chunk;
      const int64_t n = (end - c0 < p.chunk ? end - c0 : p.chunk), last_span = (n - 1) / span;
      // The state before each span's first token (Sp serves as the running state).
      if (column) load_column(Sp, ld, checkpoints + (c * p.hv + h) * size, dk, dv, j);
      for (int64_t r = 0;; ++r) {
        if (r % span == 0 && column) store_column(Sp, ld, subs + (r / span) * size, dk, dv, j);
        if (r == last_span * span) break;
        const int64_t row = (c0 + r) * p.hv + h;
        load_key_query(p, c0 + r, kh, kv, nullptr);
        simt::sync_threads();
        if (column)
          advance(Sp, ld, dk, j, simt::exp(p.g[row]), p.beta[row], p.v[row * dv + j], kv, nullptr, nullptr);
        simt::sync_threads();
      }
      for (int64_t s = last_span; s >= 0; --s) {
        const int64_t s0 = c0 + s * span, s1 = (s0 + span < c0 + n ? s0 + span : c0 + n);
        // Every state before a token of the span, and each token's u.
        if (column) load_column(Sp, ld, subs + s * size, dk, dv, j);
        for (int64_t t = s0; t < s1; ++t) {
          const int64_t row = t * p.hv + h;
          if (column) store_column(Sp, ld, states + (t - s0) * size, dk, dv, j);
          load_key_query(p, t, kh, kv, nullptr);
          simt::sync_threads();
          if (column)
            us[(t - s0) * dv + j] = advance(Sp, ld, dk, j, simt::exp(p.g[row]), p.beta[row],
                                            p.v[row * dv + j], kv, nullptr, nullptr);
          simt::sync_threads();
        }
        for (int64_t t = s1 - 1; t >= s0; --t)
          token_backward(p, d, t, h, kh, states + (t - s0) * size, column ? us[(t - s0) * dv + j] : 0.0F, Sp,
                         dS, kv, qv, dO, dl, du, parts);
      }
    }
    if (column) store_column(dS, ld, d.dstate0 + item * size, dk, dv, j);
    simt::sync_threads();  // dS is free for the next item
  }
}

}  // namespace LOOM_CUDA_NAMESPACE::delta
