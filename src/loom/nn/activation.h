// Activations of the MLP blocks, through the fused kernel when fused kernels are on.
#pragma once
#include <ATen/ATen.h>

namespace loom::nn {

// silu(gate) * up (SwiGLU's gating), elementwise.
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up);

// x * sigmoid(1.702 x) (QuickGELU); recomputed in backward under selective recompute, so only x is
// kept (the composite saves x, the sigmoid and the product).
at::Tensor quick_gelu(const at::Tensor& x);

}  // namespace loom::nn
