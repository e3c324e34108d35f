// The gated delta rule (Gated DeltaNet's linear attention) over packed rows. Each segment of
// cu_seqlens runs its own recurrence from its own state: no state crosses a sample boundary. Per
// value head, with state S (Dk, Dv), decay a_t = exp(g_t) and write strength beta_t:
//   S_t = a_t S_{t-1} + k_t (beta_t (v_t - a_t S_{t-1}^T k_t))^T,   o_t = scale * S_t^T q_t.
// Layout: q and k (T, Hk, Dk), already L2-normalised (the layer does it); v (T, Hv, Dv); g (log of
// the decay, <= 0) and beta (T, Hv); Hv a multiple of Hk, key head h serving value heads
// [h * Hv/Hk, (h + 1) * Hv/Hk) (transformers' repeat_interleave). Computed in fp32; the output in
// v's dtype. States (segments, Hv, Dk, Dv) fp32.
#pragma once
#include <ATen/ATen.h>

#include <vector>

namespace loom::kernels {

struct DeltaRuleOptions {
  double scale = 0;         // 0: 1/sqrt(Dk)
  int64_t chunk_size = 64;  // the chunked form's chunk length
};

struct DeltaRuleResult {
  at::Tensor out;          // (T, Hv, Dv)
  at::Tensor final_state;  // (segments, Hv, Dk, Dv): each segment's state after its last token
};

// The fused kernel, differentiable in q, k, v, g, beta and initial_state (each segment's state
// before its first token; zero when undefined). On the CPU each (segment, value head) runs on a
// thread of its own: the recurrence token by token in fp32, one pass over the state per step for the
// decay and the read and one for the write and the output; the state is kept at every chunk_size
// tokens, and the backward pass recomputes a chunk's states from its checkpoint, so memory grows
// with tokens / chunk_size states, not tokens. In a CUDA build, CUDA tensors get the CUDA kernel
// (kernels/cuda/delta_rule_kernels.cuh): a block per (segment, value head), the state in shared
// memory, the same checkpoints. Tensors elsewhere get composite_delta_rule.
DeltaRuleResult delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                           const at::Tensor& beta, const std::vector<int64_t>& cu_seqlens,
                           const at::Tensor& initial_state = {}, DeltaRuleOptions options = {});

// The chunked form in plain tensor ops (differentiable by autograd; the reference the kernels are
// tested against): each segment padded to whole chunks; within a chunk the updates are condensed by
// the UT transform (a unit lower-triangular solve), chunks scanned in order. `initial_state`
// (segments, Hv, Dk, Dv), when defined, is each segment's state before its first token; else zero.
DeltaRuleResult composite_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& g, const at::Tensor& beta,
                                     const std::vector<int64_t>& cu_seqlens,
                                     const at::Tensor& initial_state = {}, DeltaRuleOptions options = {});

// The same function token by token in plain tensor ops (generation's single step, and the second
// reference).
DeltaRuleResult recurrent_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& g, const at::Tensor& beta,
                                     const std::vector<int64_t>& cu_seqlens,
                                     const at::Tensor& initial_state = {}, DeltaRuleOptions options = {});

}  // namespace loom::kernels
