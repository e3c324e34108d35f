#include "loom/kernels/cpu/exp.h"

#include <cstring>

#include "loom/kernels/cpu/vector.h"

namespace loom::kernels::cpu {

// GCC vectorises the selects below only when comparisons may not trap (no FP exceptions are used).
// Compiled for AVX-512, AVX2 and the baseline (the widest the CPU runs is chosen at load time) with
// no fused multiply-adds, so every build rounds each step alike and returns the same bits.
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-trapping-math", "fp-contract=off")))
#endif
LOOM_VECTOR_CLONES void
exp_in_place(float* __restrict x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float clamped = v < -87.0F ? -87.0F : v;  // -inf too
    // k = round(v / ln2) by the 1.5 * 2^23 trick; r = v - k ln2 with ln2 in two parts.
    const float k = (clamped * 1.44269504088896341F + 12582912.0F) - 12582912.0F;
    const float r = (clamped - k * 0.693145751953125F) - k * 1.428606765330187e-06F;
    float p = 1.0F / 720.0F;
    p = p * r + 1.0F / 120.0F;
    p = p * r + 1.0F / 24.0F;
    p = p * r + 1.0F / 6.0F;
    p = p * r + 0.5F;
    p = p * r + 1.0F;
    p = p * r + 1.0F;
    const int32_t exponent = (static_cast<int32_t>(k) + 127) << 23;  // 2^k
    float scale;
    std::memcpy(&scale, &exponent, sizeof(scale));
    const float result = p * scale;
    x[i] = v < -87.0F ? 0.0F : result;
  }
}

}  // namespace loom::kernels::cpu
