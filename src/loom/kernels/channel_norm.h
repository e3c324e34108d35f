// Wan's VAE norm: an RMS norm over the channel dimension of channels-first activations
// [B, C, ...] (a position's C values lie S = prod(dims 2..) apart), optionally followed by SiLU:
//   y = x / max(||x||_C, 1e-12) * sqrt(C) * gamma[c],   then silu(y) when `silu`
// (upstream's F.normalize(x, dim=1) * sqrt(C) * gamma, and the SiLU that follows every norm of a
// residual block and of the heads). The fused CPU kernel reads x once per pass and saves x and one
// fp32 factor per position for backward; the composite (ATen's ops, autograd through them) makes
// a pass per op and keeps each intermediate. fp32 or bf16 on the CPU, arithmetic in fp32 (bf16:
// the normalised value rounded to bf16 before the SiLU, as the composite rounds it); other dtypes
// and devices take the composite. gamma: C elements in any shape ([C, 1, 1, 1] for 5-D inputs,
// [C, 1, 1] for 4-D ones); its gradient has its shape.
#pragma once
#include <ATen/ATen.h>

namespace loom::kernels {

at::Tensor channel_rms_norm(const at::Tensor& x, const at::Tensor& gamma, bool silu);
at::Tensor channel_rms_norm_composite(const at::Tensor& x, const at::Tensor& gamma, bool silu);

}  // namespace loom::kernels
