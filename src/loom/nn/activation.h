// Activations of the MLP blocks, through the fused kernel when fused kernels are on.
#pragma once
#include <ATen/ATen.h>

namespace loom::nn {

// silu(gate) * up (SwiGLU's gating), elementwise.
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up);

}  // namespace loom::nn
