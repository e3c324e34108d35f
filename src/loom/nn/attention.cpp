#include "loom/nn/attention.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>

#include "loom/kernels/attention.h"
#include "loom/memory/recompute.h"
#include "loom/parallel/context/ring.h"
#include "loom/parallel/context/ulysses.h"
#include "loom/util/errors.h"

namespace loom::nn {

namespace {
std::atomic<bool> fused{true};
}  // namespace

void set_fused_kernels(bool on) { fused = on; }
bool fused_kernels() { return fused; }

namespace {

// q (S, H, Lq, D), k and v (S, H, Lk, D) -> (S, H, Lq, D), with an optional causal mask (Lq = Lk) or
// a mask of the scores left out (broadcasting to (S, H, Lq, Lk)).
at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                  const at::Tensor& hidden = {}) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  auto scores = at::matmul(q, k.transpose(-2, -1)) * scale;  // (S, H, Lq, Lk)
  if (causal) {
    const int64_t length = q.size(-2);
    auto future = at::ones({length, length}, scores.options().dtype(at::kBool)).triu(1);
    scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  }
  if (hidden.defined()) scores = scores.masked_fill(hidden, -std::numeric_limits<float>::infinity());
  // Softmax in at least fp32, whatever the compute dtype.
  auto probs = at::softmax(scores, -1, at::promote_types(q.scalar_type(), at::kFloat)).to(q.scalar_type());
  return at::matmul(probs, v);
}

at::Tensor composite_segment_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const std::vector<int64_t>& cu_seqlens, bool causal) {
  const int64_t total = q.size(0), heads = q.size(1);
  // (S, length, H, D) -> (S, H, length, D), key/value heads repeated to the query heads.
  auto heads_first = [&](const at::Tensor& x) {
    auto t = x.transpose(1, 2);
    return x.size(2) == heads ? t : t.repeat_interleave(heads / x.size(2), 1);
  };
  // Group segment starts by length so each group runs as one batched product.
  std::map<int64_t, std::vector<int64_t>> starts_by_length;
  for (size_t i = 0; i + 1 < cu_seqlens.size(); ++i) {
    const int64_t length = cu_seqlens[i + 1] - cu_seqlens[i];
    if (length < 0)
      throw ModelError(fmt::format("segment_attention: cu_seqlens must not decrease, got {} then {}",
                                   cu_seqlens[i], cu_seqlens[i + 1]));
    if (length > 0) starts_by_length[length].push_back(cu_seqlens[i]);
  }
  if (starts_by_length.size() == 1 &&
      starts_by_length.begin()->second.size() * starts_by_length.begin()->first ==
          static_cast<size_t>(total)) {
    // All segments the same length: a reshape, no gather.
    const int64_t length = starts_by_length.begin()->first;
    auto split = [&](const at::Tensor& x) {
      return heads_first(x.view({total / length, length, x.size(1), x.size(2)}));
    };
    return attend(split(q), split(k), split(v), causal).transpose(1, 2).reshape_as(q);
  }
  auto out = at::empty_like(q);
  for (const auto& [length, starts] : starts_by_length) {
    auto index = at::empty({static_cast<int64_t>(starts.size()), length}, at::kLong);
    auto acc = index.accessor<int64_t, 2>();
    for (size_t s = 0; s < starts.size(); ++s)
      for (int64_t j = 0; j < length; ++j) acc[s][j] = starts[s] + j;
    auto flat = index.flatten().to(q.device());
    auto gather = [&](const at::Tensor& x) {
      return heads_first(x.index_select(0, flat).view({index.size(0), length, x.size(1), x.size(2)}));
    };
    auto result =
        attend(gather(q), gather(k), gather(v), causal).transpose(1, 2).reshape({-1, heads, q.size(2)});
    out = out.index_copy(0, flat, result);
  }
  return out;
}

}  // namespace

at::Tensor segment_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const std::vector<int64_t>& cu_seqlens, bool causal) {
  const int64_t total = q.size(0), heads = q.size(1), kv_heads = k.size(1);
  if (cu_seqlens.empty() || cu_seqlens.front() != 0 || cu_seqlens.back() != total)
    throw ModelError(fmt::format("segment_attention: cu_seqlens must run from 0 to {} tokens", total));
  if (kv_heads < 1 || heads % kv_heads)
    throw ModelError(
        fmt::format("attention: {} query heads are not a multiple of {} key/value heads", heads, kv_heads));
  if (fused) {
    int64_t longest = 0;
    for (size_t i = 0; i + 1 < cu_seqlens.size(); ++i)
      longest = std::max(longest, cu_seqlens[i + 1] - cu_seqlens[i]);
    if (longest >= kFlashMinLength) return kernels::flash_attention(q, k, v, cu_seqlens, {causal});
  }
  // Selective recompute keeps q, k and v, not the scores, probabilities and head copies; the flash
  // path above saves O(tokens) already.
  if (memory::selective())
    return memory::checkpoint(
        [cu_seqlens, causal](const std::vector<at::Tensor>& in) {
          return composite_segment_attention(in[0], in[1], in[2], cu_seqlens, causal);
        },
        {q, k, v});
  return composite_segment_attention(q, k, v, cu_seqlens, causal);
}

at::Tensor context_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const parallel::ContextAttention& plan) {
  const parallel::ContextParallelGroup& group = plan.group;
  const at::Tensor qh = parallel::ulysses_to_heads(q, group, plan.rows),
                   kh = parallel::ulysses_kv_to_heads(k, group, plan.rows),
                   vh = parallel::ulysses_kv_to_heads(v, group, plan.rows);
  const at::Tensor out = group.ring_size > 1 ? parallel::ring_attention(qh, kh, vh, plan)
                                             : segment_attention(qh, kh, vh, plan.cu_seqlens, plan.causal);
  return parallel::ulysses_to_sequence(out, group, plan.rows);
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t heads = q.size(2), kv_heads = k.size(2);
  if (heads % kv_heads)
    throw ModelError(
        fmt::format("attention: {} query heads are not a multiple of {} key/value heads", heads, kv_heads));
  if (fused && q.size(1) >= kFlashMinLength) {
    // Each row is one causal segment of the packed (B * L) tokens.
    const int64_t rows = q.size(0), length = q.size(1);
    std::vector<int64_t> cu{0};
    for (int64_t b = 0; b < rows; ++b) cu.push_back(cu.back() + length);
    auto flat = [&](const at::Tensor& x) { return x.reshape({rows * length, x.size(2), x.size(3)}); };
    return kernels::flash_attention(flat(q), flat(k), flat(v), cu, {/*causal=*/true}).view(q.sizes());
  }
  auto composite = [](const std::vector<at::Tensor>& in) {
    const int64_t heads = in[0].size(2), kv_heads = in[1].size(2);
    auto qh = in[0].transpose(1, 2);  // (B, Hq, L, D)
    auto kh = in[1].transpose(1, 2);
    auto vh = in[2].transpose(1, 2);
    if (kv_heads != heads) {
      kh = kh.repeat_interleave(heads / kv_heads, 1);
      vh = vh.repeat_interleave(heads / kv_heads, 1);
    }
    return attend(qh, kh, vh, true).transpose(1, 2);  // (B, L, Hq, D)
  };
  if (memory::selective()) return memory::checkpoint(composite, {q, k, v});  // as segment_attention
  return composite({q, k, v});
}

at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& allowed) {
  const int64_t heads = q.size(2), kv_heads = k.size(2);
  if (heads % kv_heads)
    throw ModelError(
        fmt::format("attention: {} query heads are not a multiple of {} key/value heads", heads, kv_heads));
  if (allowed.dim() != 3 || allowed.size(0) != q.size(0) || allowed.size(1) != q.size(1) ||
      allowed.size(2) != k.size(1))
    throw ModelError(fmt::format("masked_attention: the mask must be ({}, {}, {}), got ({})", q.size(0),
                                 q.size(1), k.size(1), fmt::join(allowed.sizes(), ", ")));
  auto kh = k.transpose(1, 2);  // (B, Hkv, Lk, D)
  auto vh = v.transpose(1, 2);
  if (kv_heads != heads) {
    kh = kh.repeat_interleave(heads / kv_heads, 1);
    vh = vh.repeat_interleave(heads / kv_heads, 1);
  }
  return attend(q.transpose(1, 2), kh, vh, false, allowed.logical_not().unsqueeze(1)).transpose(1, 2);
}

}  // namespace loom::nn
