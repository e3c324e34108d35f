// What the row kernels share: function multiversioning for the CPU's vector width, and bf16 bits.
#pragma once
#include <cstdint>
#include <cstring>

// Row loops compiled three times, for AVX-512, AVX2 and the x86-64 baseline; the loader picks the
// widest the CPU runs (GCC function multiversioning). Elsewhere: one plain build.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define LOOM_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define LOOM_VECTOR_CLONES
#endif

namespace loom::kernels::cpu {

// Lanes of the row reductions: a single running float sum or max cannot be vectorised (its steps
// must keep their order), 16 independent ones can, at any vector width.
constexpr int64_t kLanes = 16;

// f(0) + ... + f(n - 1) in kLanes lanes, then the lanes in order, then the tail. Inline, so it is
// vectorised for the width of the LOOM_VECTOR_CLONES function that calls it.
template <typename F>
inline float lane_sum(int64_t n, F f) {
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) lanes[j] += f(i + j);
  float sum = 0;
  for (int64_t j = 0; j < kLanes; ++j) sum += lanes[j];
  for (; i < n; ++i) sum += f(i);
  return sum;
}

// fp32 -> bf16 bits, round to nearest even as ATen's conversion does (NaN stays a quiet NaN).
inline uint16_t to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7f800000u) == 0x7f800000u)
    return static_cast<uint16_t>((bits >> 16) | ((bits & 0xffffu) ? 0x40u : 0u));
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

inline float from_bf16(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof f);
  return f;
}

// fp32 rounded to bf16 and back, as a bf16 tensor would hold it.
inline float round_bf16(float f) { return from_bf16(to_bf16(f)); }

}  // namespace loom::kernels::cpu
