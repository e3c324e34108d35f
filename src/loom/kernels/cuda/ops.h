// Loom's CUDA kernels as plain tensor functions: the forward and backward passes that the autograd
// functions of kernels/ call for CUDA tensors. Inputs are fp32, bf16 or fp16, arithmetic is fp32.
// Shapes are checked by those callers (they give the errors); these functions expect contiguous
// inputs on one device (a GPU they make current, or the CPU under the emulator).
//
// In a CUDA build they run on the GPU. In a CPU build the same kernel source is compiled for the
// SIMT emulator (simt.h) and runs on CPU tensors, which is how the CPU-only CI tests it.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

#include "loom/kernels/cuda/namespace.h"

namespace LOOM_CUDA_NAMESPACE {

// Whether CUDA tensors go to these kernels: a CUDA build. Elsewhere the callers' CUDA branches are
// still compiled (`if constexpr`, so the CPU build checks them) but discarded, and CUDA tensors
// take the composite path.
#if defined(LOOM_WITH_CUDA)
inline constexpr bool kBuilt = true;
#else
inline constexpr bool kBuilt = false;
#endif

// Where the kernels' tensors live: the current CUDA device, or the CPU under the emulator.
at::Device device();
bool emulated();

// x (rows, D), weight (D) -> y (rows, D) in promote(x, weight), rstd (rows) fp32:
// y = weight * round_to_x_dtype(x * rstd), rstd = 1 / sqrt(mean(x^2) + eps).
std::pair<at::Tensor, at::Tensor> rms_norm_forward(const at::Tensor& x, const at::Tensor& weight, double eps);
// -> dx (rows, D) in x's dtype, dweight (D) fp32.
std::pair<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& dy, const at::Tensor& x,
                                                    const at::Tensor& weight, const at::Tensor& rstd);

// silu(gate) * up, elementwise; backward -> (d gate, d up) in the inputs' dtype.
at::Tensor swiglu_forward(const at::Tensor& gate, const at::Tensor& up);
std::pair<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& dy, const at::Tensor& gate,
                                                  const at::Tensor& up);

// x (P, H, D) rotated by one angle row per position, cos and sin (P, D) fp32:
// y = x * cos + rotate_half(x) * sin. 1D RoPE, 2D vision RoPE and M-RoPE differ only in the angle
// rows. backward: dx from dy by the transposed rotation.
at::Tensor rotary_forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor rotary_backward(const at::Tensor& dy, const at::Tensor& cos, const at::Tensor& sin);

// Flash attention over packed segments (FlashAttention-2's tiling, no score matrix in memory):
// q (T, Hq, D), k and v (T, Hkv, D) of one dtype, D <= 256; cu_seqlens from 0 to T.
// window > 0: each query sees the keys within window - 1 positions (behind it only when causal).
struct AttentionShape {
  std::vector<int64_t> cu_seqlens;
  bool causal = false;
  float scale = 1;
  int64_t window = 0;
};
// -> out (T, Hq, D) in q's dtype, lse (Hq, T) fp32 (natural log of each query's scaled scores).
std::pair<at::Tensor, at::Tensor> attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                    const at::Tensor& v, const AttentionShape& shape);
// -> dq, dk, dv in q's dtype; deterministic (no atomics: dk, dv and dq are each owned by one block).
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward(const at::Tensor& dout, const at::Tensor& q,
                                                                  const at::Tensor& k, const at::Tensor& v,
                                                                  const at::Tensor& out,
                                                                  const at::Tensor& lse,
                                                                  const AttentionShape& shape);

// The gated delta rule (kernels/delta_rule.h) on fp32 contiguous tensors: q and k (T, Hk, Dk), v
// (T, Hv, Dv), g and beta (T, Hv), state0 (segments, Hv, Dk, Dv). One block per (segment, value
// head) walks the recurrence token by token, the state in shared memory; the state before every
// `chunk`-th token is kept for the backward pass (delta_rule_kernels.cuh).
struct DeltaRuleShape {
  std::vector<int64_t> cu_seqlens;  // the segments, 0 to T
  int64_t chunk = 64;               // tokens between the kept states
  float scale = 1;
};
// Whether a head of (Dk, Dv) fits the kernels here: Dv up to 512 (a thread per column) and, on a
// GPU (`device`), the backward pass's two (Dk, Dv) states within a block's shared memory.
bool delta_rule_fits(int64_t dk, int64_t dv, at::Device device);
struct DeltaRuleForward {
  at::Tensor out;          // (T, Hv, Dv) fp32
  at::Tensor final_state;  // (segments, Hv, Dk, Dv)
  at::Tensor checkpoints;  // (chunks, Hv, Dk, Dv): the state before each segment's every chunk
};
DeltaRuleForward delta_rule_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& g, const at::Tensor& beta, const at::Tensor& state0,
                                    const DeltaRuleShape& shape);
struct DeltaRuleGrads {
  at::Tensor dq, dk, dv, dg, dbeta, dstate0;  // fp32, the inputs' shapes
};
// dout (T, Hv, Dv) and dfinal (segments, Hv, Dk, Dv) fp32 contiguous, either undefined (zero).
// Deterministic: every gradient element is written by one thread, sums in a fixed order.
DeltaRuleGrads delta_rule_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& g, const at::Tensor& beta, const at::Tensor& checkpoints,
                                   const at::Tensor& dout, const at::Tensor& dfinal,
                                   const DeltaRuleShape& shape);

}  // namespace LOOM_CUDA_NAMESPACE
