// Process-wide switch between Loom's fused kernels (flash attention, RMSNorm, SwiGLU, rotary
// embedding) and the straightforward composite forms; the trainer sets it from
// features.fused_kernels (default on).
#pragma once

namespace loom::nn {

void set_fused_kernels(bool on);
bool fused_kernels();

}  // namespace loom::nn
