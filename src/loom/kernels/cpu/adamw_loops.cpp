#include "loom/kernels/cpu/adamw_loops.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "loom/kernels/cpu/vector.h"

namespace loom::kernels::cpu {
namespace {

// One element's update, shared by every form so that each rounds alike.
template <bool Decay>
inline float adam_element(float w, float g, float& m, float& v, const AdamWScalars& s) {
  float wi = Decay ? w * s.decay_factor : w;
  const float mi = m * s.b1 + g * s.one_minus_b1;
  const float vi = v * s.b2 + g * g * s.one_minus_b2;
  wi -= s.step_size * (mi / (std::sqrt(vi) * s.inv_sqrt_bc2 + s.eps));
  m = mi;
  v = vi;
  return wi;
}

inline float grad_at(const uint16_t* g, int64_t i) { return from_bf16(g[i]); }
inline float grad_at(const float* g, int64_t i) { return g[i]; }

// Each loop is instantiated per gradient type, decay and bf16 output, so its body has no branch.
template <typename G, bool Decay, bool Param>
LOOM_VECTOR_CLONES void update(float* w, const G* g, float* m, float* v, uint16_t* param, int64_t n,
                               AdamWScalars s) {
  for (int64_t i = 0; i < n; ++i) {
    const float wi = adam_element<Decay>(w[i], grad_at(g, i), m[i], v[i], s);
    w[i] = wi;
    if constexpr (Param) param[i] = to_bf16(wi);
  }
}

// Elements of a split weight decoded at once, on the stack.
constexpr int64_t kSplitChunk = 512;

template <typename G, bool Decay>
LOOM_VECTOR_CLONES void update_split(uint16_t* param, int16_t* residual, const int64_t* old_ties,
                                     const int64_t* old_ties_end, std::vector<int64_t>& new_ties,
                                     int64_t first, const G* g, float* m, float* v, int64_t n,
                                     AdamWScalars s) {
  float w[kSplitChunk];
  for (int64_t c = 0; c < n; c += kSplitChunk) {
    const int64_t len = std::min(kSplitChunk, n - c);
    uint16_t* p = param + c;
    int16_t* r = residual + c;
    for (int64_t i = 0; i < len; ++i) w[i] = join_bf16(p[i], r[i], false);
    for (; old_ties != old_ties_end && *old_ties < first + c + len; ++old_ties) {
      const int64_t i = *old_ties - first - c;
      w[i] = join_bf16(p[i], r[i], true);
    }
    // Update and encode in one pass, counting the ties rounded down (rare: then found again).
    int32_t ties = 0;
    for (int64_t i = 0; i < len; ++i) {
      const float wi = adam_element<Decay>(w[i], grad_at(g, c + i), m[c + i], v[c + i], s);
      w[i] = wi;
      const uint16_t hi = to_bf16(wi);
      const int32_t ri = bf16_residual_wide(wi, hi);
      p[i] = hi;
      r[i] = static_cast<int16_t>(static_cast<uint16_t>(ri & 0xffff));
      ties += ri == 0x8000;
    }
    if (ties == 0) continue;
    for (int64_t i = 0; i < len; ++i)
      if (bf16_residual_wide(w[i], p[i]) == 0x8000) new_ties.push_back(first + c + i);
  }
}

}  // namespace

void adamw_update(float* w, AdamWGrad g, float* m, float* v, uint16_t* param, int64_t n, AdamWScalars s,
                  bool decay) {
  auto run = [&](auto grad) {
    using G = std::remove_const_t<std::remove_pointer_t<decltype(grad)>>;
    if (decay)
      param ? update<G, true, true>(w, grad, m, v, param, n, s)
            : update<G, true, false>(w, grad, m, v, param, n, s);
    else
      param ? update<G, false, true>(w, grad, m, v, param, n, s)
            : update<G, false, false>(w, grad, m, v, param, n, s);
  };
  g.g16 ? run(g.g16) : run(g.g32);
}

void adamw_update_split(uint16_t* param, int16_t* residual, const int64_t* old_ties,
                        const int64_t* old_ties_end, std::vector<int64_t>& new_ties, int64_t first,
                        AdamWGrad g, float* m, float* v, int64_t n, AdamWScalars s, bool decay) {
  auto run = [&](auto grad) {
    using G = std::remove_const_t<std::remove_pointer_t<decltype(grad)>>;
    decay
        ? update_split<G, true>(param, residual, old_ties, old_ties_end, new_ties, first, grad, m, v, n, s)
        : update_split<G, false>(param, residual, old_ties, old_ties_end, new_ties, first, grad, m, v, n, s);
  };
  g.g16 ? run(g.g16) : run(g.g32);
}

}  // namespace loom::kernels::cpu
