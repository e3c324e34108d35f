// AdamW's per-element loops, apart from the tensors: a pass over n contiguous elements of one
// tensor. Compiled without errno for the square root (-fno-math-errno: the root itself is the same
// IEEE result) and for the CPU's vector width, so each loop vectorises; kernels/adamw.cpp cuts the
// tensors into tasks and calls these.
#pragma once
#include <cstdint>
#include <vector>

namespace loom::kernels::cpu {

// The step's constants in fp32: decay_factor = 1 - lr * weight_decay, the moments' betas,
// inv_sqrt_bc2 = 1 / sqrt(1 - beta2^t), step_size = lr / (1 - beta1^t).
struct AdamWScalars {
  float decay_factor, b1, one_minus_b1, b2, one_minus_b2, inv_sqrt_bc2, eps, step_size;
};

// The gradient: bf16 bits (g16) or fp32 (g32), one of them null.
struct AdamWGrad {
  const uint16_t* g16 = nullptr;
  const float* g32 = nullptr;
};

// An fp32 weight w, and optionally its rounding written to the bf16 parameter `param`.
void adamw_update(float* w, AdamWGrad g, float* m, float* v, uint16_t* param, int64_t n, AdamWScalars s,
                  bool decay);

// A split weight: the bf16 parameter and its residual (bf16_residual in vector.h). `old_ties` are
// the indices (from the tensor's start) in [first, first + n) whose residual is +0x8000; the new
// ones are appended to `new_ties`. The same arithmetic as adamw_update, bit for bit.
void adamw_update_split(uint16_t* param, int16_t* residual, const int64_t* old_ties,
                        const int64_t* old_ties_end, std::vector<int64_t>& new_ties, int64_t first,
                        AdamWGrad g, float* m, float* v, int64_t n, AdamWScalars s, bool decay);

}  // namespace loom::kernels::cpu
