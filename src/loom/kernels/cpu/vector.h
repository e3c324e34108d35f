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
// Both results are computed and one selected, without a branch, so loops calling it vectorise.
inline uint16_t to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const uint32_t special = (bits >> 16) | ((bits & 0xffffu) ? 0x40u : 0u);  // infinity, NaN
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((bits & 0x7f800000u) == 0x7f800000u ? special : rounded);
}

inline float from_bf16(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof f);
  return f;
}

// fp32 rounded to bf16 and back, as a bf16 tensor would hold it.
inline float round_bf16(float f) { return from_bf16(to_bf16(f)); }

// An fp32 value held as two 16-bit halves: h = to_bf16(w), the bf16 parameter itself, and the
// residual r = bits(w) - (h << 16). Rounding to nearest keeps r in [-0x8000, 0x8000]; both ends are
// ties, which round to an even h, so the residual stores -0x8000 for both and the one value it
// cannot hold, +0x8000 (a tie rounded down), is flagged by `tie_down`. A finite w that rounds to
// infinity keeps its residual; a NaN keeps its sign and quiet bit only (r = 0), as any NaN
// update leaves the weight a NaN. bf16_residual_wide gives r itself.
inline int32_t bf16_residual_wide(float w, uint16_t h) {
  uint32_t bits;
  std::memcpy(&bits, &w, sizeof bits);
  const bool nan = (h & 0x7fffu) > 0x7f80u;
  return nan ? 0 : static_cast<int32_t>(bits - (static_cast<uint32_t>(h) << 16));
}

// The residual as stored (+0x8000 wraps to -0x8000) and whether it was a tie rounded down.
inline int16_t bf16_residual(float w, uint16_t h, bool& tie_down) {
  const int32_t r = bf16_residual_wide(w, h);
  tie_down = r == 0x8000;
  return static_cast<int16_t>(static_cast<uint16_t>(r & 0xffff));
}

// The fp32 value of a bf16 half and its residual (bf16_residual's inverse).
inline float join_bf16(uint16_t h, int16_t residual, bool tie_down) {
  const int32_t r = tie_down ? 0x8000 : residual;
  const uint32_t bits = (static_cast<uint32_t>(h) << 16) + static_cast<uint32_t>(r);
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace loom::kernels::cpu
