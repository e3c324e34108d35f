// Fused row-wise kernels of the transformer blocks, each an autograd function with a CPU
// implementation that reads and writes every element once per pass (the composite forms make
// several passes and keep intermediates for backward), threaded over rows and compiled for the
// CPU's vector width (AVX-512, AVX2 or the baseline, chosen at run time). Each has its composite
// reference beside it. fp32 or bf16 inputs, arithmetic in fp32; other dtypes (fp64 for gradient
// checks) take the composite path.
#pragma once
#include <ATen/ATen.h>

namespace loom::kernels {

// RMSNorm over the last dimension: weight * (x / sqrt(mean(x^2) + eps)), the normalised value
// rounded to x's dtype before the weight multiplies it (as HuggingFace's Qwen2 RMSNorm does).
// Saves x and one fp32 scale per row; differentiable in x and weight.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor rms_norm_composite(const at::Tensor& x, const at::Tensor& weight, double eps);

// LayerNorm over the last dimension: (x - mean) / sqrt(var + eps) * weight + bias, the statistics
// and the affine map in fp32, the result in x's dtype. Saves x and two fp32 numbers per row;
// differentiable in x, weight and bias.
at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps);
at::Tensor layer_norm_composite(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                double eps);

// SwiGLU's gate: silu(gate) * up, elementwise (same shapes). Saves only its two inputs.
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up);
at::Tensor swiglu_composite(const at::Tensor& gate, const at::Tensor& up);

// Rotary embedding with rotate-half pairs: x * cos + rotate_half(x) * sin, where
// rotate_half([a, b]) = [-b, a] over the last dimension. x (..., H, D); cos and sin broadcast to
// (..., 1, D): one angle row per position, shared by the H heads. The result has x's dtype;
// differentiable in x only (angles come from positions).
at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor rotary_composite(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace loom::kernels
