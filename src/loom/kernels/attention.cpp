#include "loom/kernels/attention.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "loom/kernels/cpu/exp.h"
#include "loom/kernels/cpu/gemm.h"
#include "loom/kernels/cpu/vector.h"
#include "loom/kernels/cuda/ops.h"
#include "loom/util/errors.h"

namespace loom::kernels {

namespace {

// Tile sizes: 128 queries against up to 512 keys per product in the forward pass (large products
// run near BLAS's peak; a causal tile stops at its last query, so at most 127 keys are wasted), and
// 256 queries against 256 keys in the backward pass, where a causal diagonal tile is computed
// whole (at seq 4096, 256 x 256 takes 273 ms, 256 x 128 286 ms, 128 x 256 287 ms, 256 x 384 290).
constexpr int64_t kRows = 128;
constexpr int64_t kBackwardRows = 256;
constexpr int64_t kForwardCols = 512;
constexpr int64_t kCols = 256;
constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();

struct Problem {
  int64_t q_tokens = 0, k_tokens = 0, heads = 0, kv_heads = 0, dim = 0;
  float scale = 1;
  bool causal = false;
  int64_t window = 0;  // 0: unlimited
  std::vector<AttentionBlock> blocks;
  std::vector<int64_t> cu;  // when the blocks are cu_seqlens' segments (what the CUDA kernels take)
  // Keys [key_begin, key_end) of a block of `k_length` keys that query `row` sees.
  int64_t key_begin(int64_t row) const { return window > 0 ? std::max<int64_t>(0, row - window + 1) : 0; }
  int64_t key_end(int64_t row, int64_t k_length) const {
    if (causal) return std::min(k_length, row + 1);
    return window > 0 ? std::min(k_length, row + window) : k_length;
  }
  // Queries [query_begin, query_end) of a block of `q_length` queries that see key `col`.
  int64_t query_begin(int64_t col) const {
    if (causal) return col;
    return window > 0 ? std::max<int64_t>(0, col - window + 1) : 0;
  }
  int64_t query_end(int64_t col, int64_t q_length) const {
    return window > 0 ? std::min(q_length, col + window) : q_length;
  }
  int64_t group() const { return heads / kv_heads; }
  int64_t q_stride() const { return heads * dim; }  // between consecutive tokens of one head
  int64_t kv_stride() const { return kv_heads * dim; }
};

// Ranges [begin, begin + length) that must not overlap, each within [0, limit).
void check_ranges(std::vector<std::pair<int64_t, int64_t>> ranges, int64_t limit, const char* what) {
  std::sort(ranges.begin(), ranges.end());
  int64_t covered = 0;
  for (const auto& [begin, length] : ranges) {
    if (begin < 0 || length < 0 || begin + length > limit)
      throw ModelError(
          fmt::format("attention blocks: {} [{}, {}) outside [0, {})", what, begin, begin + length, limit));
    if (length == 0) continue;
    if (begin < covered)
      throw ModelError(fmt::format("attention blocks: two blocks share {} at {}", what, begin));
    covered = begin + length;
  }
}

Problem problem_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   std::vector<AttentionBlock> blocks, const AttentionOptions& options) {
  if (q.dim() != 3 || k.dim() != 3 || v.dim() != 3 || k.sizes() != v.sizes() || q.size(2) != k.size(2))
    throw ModelError(
        fmt::format("flash_attention: q (T, Hq, D) and k, v (T, Hkv, D) expected, got [{}], [{}], [{}]",
                    fmt::join(q.sizes(), ", "), fmt::join(k.sizes(), ", "), fmt::join(v.sizes(), ", ")));
  Problem p;
  p.q_tokens = q.size(0);
  p.k_tokens = k.size(0);
  p.heads = q.size(1);
  p.kv_heads = k.size(1);
  p.dim = q.size(2);
  if (p.kv_heads < 1 || p.heads % p.kv_heads != 0)
    throw ModelError(fmt::format("flash_attention: {} query heads are not a multiple of {} key/value heads",
                                 p.heads, p.kv_heads));
  if (options.window < 0)
    throw ModelError(fmt::format("flash_attention: window must be >= 0 (0: none), got {}", options.window));
  std::vector<std::pair<int64_t, int64_t>> queries, keys;
  for (const AttentionBlock& b : blocks) {
    if ((options.causal || options.window > 0) && b.q_length != b.k_length)
      throw ModelError(
          fmt::format("attention blocks: a causal or windowed block is square, got {} queries "
                      "against {} keys",
                      b.q_length, b.k_length));
    queries.emplace_back(b.q_begin, b.q_length);
    keys.emplace_back(b.k_begin, b.k_length);
  }
  check_ranges(std::move(queries), p.q_tokens, "queries");
  check_ranges(std::move(keys), p.k_tokens, "keys");
  p.blocks = std::move(blocks);
  p.causal = options.causal;
  p.window = options.window;
  p.scale =
      static_cast<float>(options.scale > 0 ? options.scale : 1.0 / std::sqrt(static_cast<double>(p.dim)));
  return p;
}

Problem problem_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const std::vector<int64_t>& cu, const AttentionOptions& options) {
  if (q.dim() == 3 && k.dim() == 3 && q.size(0) != k.size(0))
    throw ModelError(fmt::format("flash_attention: q has {} tokens, k {}", q.size(0), k.size(0)));
  const int64_t tokens = q.dim() > 0 ? q.size(0) : 0;
  if (cu.empty() || cu.front() != 0 || cu.back() != tokens)
    throw ModelError(fmt::format("flash_attention: cu_seqlens must run from 0 to {} tokens", tokens));
  for (size_t i = 1; i < cu.size(); ++i)
    if (cu[i] < cu[i - 1])
      throw ModelError(
          fmt::format("flash_attention: cu_seqlens must not decrease, got {} then {}", cu[i - 1], cu[i]));
  Problem p = problem_of(q, k, v, segment_blocks(cu), options);
  p.cu = cu;
  return p;
}

at::Tensor fp32(const at::Tensor& t) { return t.to(at::kFloat).contiguous(); }

// Row reductions in independent lanes, compiled for the CPU's vector width.
using cpu::kLanes;

LOOM_VECTOR_CLONES float row_max(const float* x, int64_t n, float init) {
  float lanes[kLanes];
  std::fill(lanes, lanes + kLanes, init);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) lanes[j] = lanes[j] < x[i + j] ? x[i + j] : lanes[j];
  float top = init;
  for (int64_t j = 0; j < kLanes; ++j) top = std::max(top, lanes[j]);
  for (; i < n; ++i) top = std::max(top, x[i]);
  return top;
}

LOOM_VECTOR_CLONES float row_sum(const float* x, int64_t n) {
  return cpu::lane_sum(n, [&](int64_t i) { return x[i]; });
}

LOOM_VECTOR_CLONES void add_to_row(float* x, int64_t n, float value) {
  for (int64_t i = 0; i < n; ++i) x[i] += value;
}

// dS = P (dP - delta) scale over one row, in place of dP.
LOOM_VECTOR_CLONES void softmax_backward_row(float* __restrict ds, const float* __restrict probs, int64_t n,
                                             float delta, float scale) {
  for (int64_t i = 0; i < n; ++i) ds[i] = probs[i] * (ds[i] - delta) * scale;
}

// The columns [first, last) of the key tile [col0, col0 + cols) that query `row` sees.
std::pair<int64_t, int64_t> visible(const Problem& p, int64_t row, int64_t k_length, int64_t col0,
                                    int64_t cols) {
  const int64_t first = std::clamp<int64_t>(p.key_begin(row) - col0, 0, cols);
  const int64_t last = std::clamp<int64_t>(p.key_end(row, k_length) - col0, 0, cols);
  return {first, std::max(first, last)};
}

struct QueryTile {
  size_t block;
  int64_t head, row0;  // query rows row0.. of the block
};

// out (Tq, Hq, D) and lse (Hq, Tq), both fp32, written for the queries of the blocks only.
void forward_kernel(const Problem& p, const float* q, const float* k, const float* v, float* out,
                    float* lse) {
  std::vector<QueryTile> tiles;
  for (size_t b = 0; b < p.blocks.size(); ++b)
    if (p.blocks[b].k_length > 0)
      for (int64_t h = 0; h < p.heads; ++h)
        for (int64_t row0 = 0; row0 < p.blocks[b].q_length; row0 += kRows) tiles.push_back({b, h, row0});
  const int64_t d = p.dim, ldq = p.q_stride(), ldk = p.kv_stride();
  const cpu::SingleThreadedBlas single_threaded_blas;
  at::parallel_for(0, static_cast<int64_t>(tiles.size()), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(kRows * kForwardCols), acc(kRows * d), m(kRows), l(kRows);
    for (int64_t t = begin; t < end; ++t) {
      const QueryTile& w = tiles[static_cast<size_t>(t)];
      const AttentionBlock& b = p.blocks[w.block];
      const int64_t rows = std::min(kRows, b.q_length - w.row0), g = w.head / p.group();
      const float* qt = q + ((b.q_begin + w.row0) * p.heads + w.head) * d;
      const float* kb = k + (b.k_begin * p.kv_heads + g) * d;
      const float* vb = v + (b.k_begin * p.kv_heads + g) * d;
      std::fill(acc.begin(), acc.begin() + rows * d, 0.0F);
      std::fill(m.begin(), m.end(), kMinusInfinity);
      std::fill(l.begin(), l.end(), 0.0F);
      // The keys any row of the tile sees: blocks outside them are skipped outright.
      const int64_t key_begin = p.key_begin(w.row0), key_end = p.key_end(w.row0 + rows - 1, b.k_length);
      for (int64_t col0 = key_begin; col0 < key_end; col0 += kForwardCols) {
        const int64_t cols = std::min(kForwardCols, key_end - col0);
        cpu::gemm(false, true, rows, cols, d, p.scale, qt, ldq, kb + col0 * ldk, ldk, 0.0F, scores.data(),
                  kForwardCols);
        for (int64_t r = 0; r < rows; ++r) {
          float* row = scores.data() + r * kForwardCols;
          const auto [first, last] = visible(p, w.row0 + r, b.k_length, col0, cols);
          const float top = row_max(row + first, last - first, m[r]);
          if (first == last || top == kMinusInfinity) {
            std::fill(row, row + cols, 0.0F);
            continue;
          }
          add_to_row(row + first, last - first, -top);
          cpu::exp_in_place(row + first, last - first);
          const float sum = row_sum(row + first, last - first);
          std::fill(row, row + first, 0.0F);
          std::fill(row + last, row + cols, 0.0F);
          const float rescale = std::exp(m[r] - top);  // 0 while nothing was seen
          l[r] = l[r] * rescale + sum;
          if (rescale != 1.0F)
            for (float *a = acc.data() + r * d, *a_end = a + d; a < a_end; ++a) *a *= rescale;
          m[r] = top;
        }
        cpu::gemm(false, false, rows, d, cols, 1.0F, scores.data(), kForwardCols, vb + col0 * ldk, ldk, 1.0F,
                  acc.data(), d);
      }
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t token = b.q_begin + w.row0 + r;
        const float inverse = l[r] > 0 ? 1.0F / l[r] : 0.0F;
        float* o = out + (token * p.heads + w.head) * d;
        for (int64_t i = 0; i < d; ++i) o[i] = acc[r * d + i] * inverse;
        lse[w.head * p.q_tokens + token] = l[r] > 0 ? m[r] + std::log(l[r]) : kMinusInfinity;
      }
    }
  });
}

// dq, dk, dv (zeros on entry): fp32 in q's and k's layouts.
void backward_kernel(const Problem& p, const float* q, const float* k, const float* v, const float* out,
                     const float* dout, const float* lse, float* dq, float* dk, float* dv) {
  const int64_t d = p.dim, ldq = p.q_stride(), ldk = p.kv_stride();
  const cpu::SingleThreadedBlas single_threaded_blas;
  // delta = rowsum(dO * O), per token and query head.
  std::vector<float> delta(static_cast<size_t>(p.q_tokens * p.heads));
  at::parallel_for(0, p.q_tokens * p.heads, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float sum = 0;
      for (int64_t j = 0; j < d; ++j) sum += dout[i * d + j] * out[i * d + j];
      delta[static_cast<size_t>(i)] = sum;
    }
  });
  // One task per block and key/value head: it alone writes that head's dk, dv rows and the dq
  // rows of its query heads (blocks share no queries and no keys), so tasks never share an output.
  struct Task {
    size_t block;
    int64_t kv_head;
  };
  std::vector<Task> tasks;
  for (size_t b = 0; b < p.blocks.size(); ++b)
    if (p.blocks[b].q_length > 0)
      for (int64_t g = 0; g < p.kv_heads; ++g) tasks.push_back({b, g});
  at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> probs(kBackwardRows * kCols), dprobs(kBackwardRows * kCols), dk_acc(kCols * d),
        dv_acc(kCols * d);
    for (int64_t t = begin; t < end; ++t) {
      const Task& w = tasks[static_cast<size_t>(t)];
      const AttentionBlock& b = p.blocks[w.block];
      for (int64_t col0 = 0; col0 < b.k_length; col0 += kCols) {
        const int64_t cols = std::min(kCols, b.k_length - col0);
        const float* kt = k + ((b.k_begin + col0) * p.kv_heads + w.kv_head) * d;
        const float* vt = v + ((b.k_begin + col0) * p.kv_heads + w.kv_head) * d;
        std::fill(dk_acc.begin(), dk_acc.begin() + cols * d, 0.0F);
        std::fill(dv_acc.begin(), dv_acc.begin() + cols * d, 0.0F);
        for (int64_t h = w.kv_head * p.group(); h < (w.kv_head + 1) * p.group(); ++h) {
          // The queries that see any key of the tile: rows outside them are skipped outright.
          const int64_t row_end = p.query_end(col0 + cols - 1, b.q_length);
          for (int64_t row0 = p.query_begin(col0) / kBackwardRows * kBackwardRows; row0 < row_end;
               row0 += kBackwardRows) {
            const int64_t rows = std::min(kBackwardRows, b.q_length - row0);
            const int64_t first =
                (b.q_begin + row0) * p.heads + h;  // (token, head) index of the tile's row 0
            const float* qt = q + first * d;
            const float* dot = dout + first * d;
            cpu::gemm(false, true, rows, cols, d, p.scale, qt, ldq, kt, ldk, 0.0F, probs.data(), kCols);
            for (int64_t r = 0; r < rows; ++r) {
              float* row = probs.data() + r * kCols;
              const auto [first, last] = visible(p, row0 + r, b.k_length, col0, cols);
              const float log_sum = lse[h * p.q_tokens + b.q_begin + row0 + r];
              add_to_row(row + first, last - first, -log_sum);
              cpu::exp_in_place(row + first, last - first);
              std::fill(row, row + first, 0.0F);
              std::fill(row + last, row + cols, 0.0F);
            }
            // dV += P^T dO; dP = dO V^T; dS = P (dP - delta) scale; dK += dS^T Q; dQ += dS K.
            cpu::gemm(true, false, cols, d, rows, 1.0F, probs.data(), kCols, dot, ldq, 1.0F, dv_acc.data(),
                      d);
            cpu::gemm(false, true, rows, cols, d, 1.0F, dot, ldq, vt, ldk, 0.0F, dprobs.data(), kCols);
            for (int64_t r = 0; r < rows; ++r) {
              softmax_backward_row(dprobs.data() + r * kCols, probs.data() + r * kCols, cols,
                                   delta[static_cast<size_t>((b.q_begin + row0 + r) * p.heads + h)], p.scale);
            }
            cpu::gemm(true, false, cols, d, rows, 1.0F, dprobs.data(), kCols, qt, ldq, 1.0F, dk_acc.data(),
                      d);
            cpu::gemm(false, false, rows, d, cols, 1.0F, dprobs.data(), kCols, kt, ldk, 1.0F, dq + first * d,
                      ldq);
          }
        }
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t at_row = ((b.k_begin + col0 + c) * p.kv_heads + w.kv_head) * d;
          std::copy(dk_acc.begin() + c * d, dk_acc.begin() + (c + 1) * d, dk + at_row);
          std::copy(dv_acc.begin() + c * d, dv_acc.begin() + (c + 1) * d, dv + at_row);
        }
      }
    }
  });
}

// The CPU kernels on fp32 copies of the inputs.
AttentionResult cpu_forward(const Problem& p, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const at::Tensor q32 = fp32(q), k32 = fp32(k), v32 = fp32(v);
  at::Tensor out = at::zeros({p.q_tokens, p.heads, p.dim}, at::kFloat);
  at::Tensor lse = at::full({p.heads, p.q_tokens}, kMinusInfinity, at::kFloat);
  forward_kernel(p, q32.data_ptr<float>(), k32.data_ptr<float>(), v32.data_ptr<float>(),
                 out.data_ptr<float>(), lse.data_ptr<float>());
  return {out, lse};
}

AttentionGrads cpu_backward(const Problem& p, const at::Tensor& dout, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                            const at::Tensor& lse) {
  const at::Tensor q32 = fp32(q), k32 = fp32(k), v32 = fp32(v), dout32 = fp32(dout), out32 = fp32(out),
                   lse32 = fp32(lse);
  at::Tensor dq = at::zeros({p.q_tokens, p.heads, p.dim}, at::kFloat);
  at::Tensor dk = at::zeros({p.k_tokens, p.kv_heads, p.dim}, at::kFloat);
  at::Tensor dv = at::zeros({p.k_tokens, p.kv_heads, p.dim}, at::kFloat);
  backward_kernel(p, q32.data_ptr<float>(), k32.data_ptr<float>(), v32.data_ptr<float>(),
                  out32.data_ptr<float>(), dout32.data_ptr<float>(), lse32.data_ptr<float>(),
                  dq.data_ptr<float>(), dk.data_ptr<float>(), dv.data_ptr<float>());
  return {dq, dk, dv};
}

// Query i of a square block sees key j when j is within [key_begin(i), key_end(i)); every key of a
// plain block.
at::Tensor hidden_scores(const Problem& p, const AttentionBlock& b, const at::Device& device) {
  const auto index = at::TensorOptions().dtype(at::kLong).device(device);
  auto hidden = at::zeros({b.q_length, b.k_length}, index.dtype(at::kBool));
  if (!p.causal && p.window == 0) return hidden;
  const auto rows = at::arange(b.q_length, index).unsqueeze(1),
             cols = at::arange(b.k_length, index).unsqueeze(0);
  if (p.causal) hidden = hidden.logical_or(cols > rows);
  if (p.window > 0) {
    hidden = hidden.logical_or(cols <= rows - p.window);
    if (!p.causal) hidden = hidden.logical_or(cols >= rows + p.window);
  }
  return hidden;
}

// (length, H, D) rows from `begin` as (Hq, length, D) fp32, key/value heads repeated to the query heads.
at::Tensor block_rows(const Problem& p, const at::Tensor& x, int64_t begin, int64_t length) {
  return x.narrow(0, begin, length).to(at::kFloat).transpose(0, 1).repeat_interleave(p.heads / x.size(1), 0);
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class FlashAttentionFunction : public torch::autograd::Function<FlashAttentionFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, std::vector<int64_t> cu_seqlens, bool causal,
                               double scale, int64_t window) {
    const Problem p = problem_of(q, k, v, cu_seqlens, {causal, scale, window});
    ctx->saved_data["cu_seqlens"] = cu_seqlens;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["window"] = window;
    if constexpr (cuda::kBuilt) {
      if (q.is_cuda()) {
        const at::Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
        auto [out, lse] = cuda::attention_forward(qc, kc, vc, {p.cu, p.causal, p.scale, p.window});
        ctx->save_for_backward({qc, kc, vc, out, lse});
        ctx->mark_non_differentiable({lse});
        return {out, lse};
      }
    }
    auto [out, lse] = cpu_forward(p, q, k, v);
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->mark_non_differentiable({lse});
    return {out.to(q.scalar_type()), lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const Problem p = problem_of(q, k, v, ctx->saved_data["cu_seqlens"].toIntVector(),
                                 {ctx->saved_data["causal"].toBool(), ctx->saved_data["scale"].toDouble(),
                                  ctx->saved_data["window"].toInt()});
    if constexpr (cuda::kBuilt) {
      if (q.is_cuda()) {
        auto [dq, dk, dv] = cuda::attention_backward(grads[0].contiguous(), q, k, v, out, lse,
                                                     {p.cu, p.causal, p.scale, p.window});
        return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
      }
    }
    auto [dq, dk, dv] = cpu_backward(p, grads[0], q, k, v, out, lse);
    return {dq.to(q.scalar_type()),
            dk.to(k.scalar_type()),
            dv.to(v.scalar_type()),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::vector<int64_t>& cu_seqlens, AttentionOptions options,
                           at::Tensor* lse) {
  // The CPU kernel takes CPU tensors; the CUDA kernels (in a CUDA build) CUDA tensors of one
  // floating dtype on one device, head_dim up to 256. Others get the composite, which has no
  // log-sum-exp to give.
  const at::ScalarType type = q.scalar_type();
  const bool on_cuda = cuda::kBuilt && q.is_cuda() && k.device() == q.device() && v.device() == q.device() &&
                       q.dim() == 3 && q.size(2) <= 256 && q.size(1) <= 65535 && type == k.scalar_type() &&
                       type == v.scalar_type() &&
                       (type == at::kFloat || type == at::kBFloat16 || type == at::kHalf);
  if (!on_cuda && !(q.is_cpu() && k.is_cpu() && v.is_cpu())) {
    if (lse)
      throw ModelError(fmt::format("flash_attention: no kernel for {} tensors here to give the log-sum-exp",
                                   q.device().str()));
    return composite_attention(q, k, v, cu_seqlens, options);
  }
  auto outputs =
      FlashAttentionFunction::apply(q, k, v, cu_seqlens, options.causal, options.scale, options.window);
  if (lse) *lse = outputs[1];
  return outputs[0];
}

at::Tensor composite_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const std::vector<int64_t>& cu_seqlens, AttentionOptions options) {
  const Problem p = problem_of(q, k, v, cu_seqlens, options);
  std::vector<at::Tensor> parts;
  for (size_t s = 0; s + 1 < p.cu.size(); ++s) {
    const int64_t start = p.cu[s], length = p.cu[s + 1] - p.cu[s];
    if (length == 0) continue;
    auto heads_first = [&](const at::Tensor& x) {
      return x.narrow(0, start, length).transpose(0, 1).repeat_interleave(p.heads / x.size(1), 0);
    };
    auto scores = at::matmul(heads_first(q), heads_first(k).transpose(1, 2)) * p.scale;  // (H, L, L)
    const auto hidden = hidden_scores(p, {start, length, start, length}, q.device());
    scores = scores.masked_fill(hidden, kMinusInfinity);
    auto probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
    parts.push_back(at::matmul(probs, heads_first(v)).transpose(0, 1));  // (L, H, D)
  }
  return parts.empty() ? at::zeros_like(q) : at::cat(parts, 0);
}

std::vector<AttentionBlock> segment_blocks(const std::vector<int64_t>& cu_seqlens) {
  std::vector<AttentionBlock> blocks;
  for (size_t i = 0; i + 1 < cu_seqlens.size(); ++i) {
    const int64_t length = cu_seqlens[i + 1] - cu_seqlens[i];
    blocks.push_back({cu_seqlens[i], length, cu_seqlens[i], length});
  }
  return blocks;
}

AttentionResult attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const std::vector<AttentionBlock>& blocks, AttentionOptions options) {
  if (!(q.is_cpu() && k.is_cpu() && v.is_cpu())) return composite_attention_forward(q, k, v, blocks, options);
  const at::NoGradGuard no_grad;
  return cpu_forward(problem_of(q, k, v, blocks, options), q, k, v);
}

AttentionGrads attention_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                  const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                  const std::vector<AttentionBlock>& blocks, AttentionOptions options) {
  if (!(q.is_cpu() && k.is_cpu() && v.is_cpu()))
    return composite_attention_backward(dout, q, k, v, out, lse, blocks, options);
  const at::NoGradGuard no_grad;
  return cpu_backward(problem_of(q, k, v, blocks, options), dout, q, k, v, out, lse);
}

AttentionResult composite_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                            const std::vector<AttentionBlock>& blocks,
                                            AttentionOptions options) {
  const at::NoGradGuard no_grad;
  const Problem p = problem_of(q, k, v, blocks, options);
  const auto f32 = q.options().dtype(at::kFloat);
  at::Tensor out = at::zeros({p.q_tokens, p.heads, p.dim}, f32);
  at::Tensor lse = at::full({p.heads, p.q_tokens}, kMinusInfinity, f32);
  for (const AttentionBlock& b : p.blocks) {
    if (b.q_length == 0 || b.k_length == 0) continue;
    auto scores = at::matmul(block_rows(p, q, b.q_begin, b.q_length),
                             block_rows(p, k, b.k_begin, b.k_length).transpose(1, 2)) *
                  p.scale;  // (H, Lq, Lk)
    scores = scores.masked_fill(hidden_scores(p, b, q.device()), kMinusInfinity);
    const auto log_sum = at::logsumexp(scores, -1);  // (H, Lq)
    // A query that sees no key keeps out 0 and lse -inf (exp(-inf - -inf) would be NaN).
    const auto probs =
        at::exp(scores - log_sum.unsqueeze(-1)).masked_fill(at::isinf(log_sum).unsqueeze(-1), 0.0);
    out.narrow(0, b.q_begin, b.q_length)
        .copy_(at::matmul(probs, block_rows(p, v, b.k_begin, b.k_length)).transpose(0, 1));
    lse.narrow(1, b.q_begin, b.q_length).copy_(log_sum);
  }
  return {out, lse};
}

AttentionGrads composite_attention_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                            const std::vector<AttentionBlock>& blocks,
                                            AttentionOptions options) {
  const at::NoGradGuard no_grad;
  const Problem p = problem_of(q, k, v, blocks, options);
  const auto f32 = q.options().dtype(at::kFloat);
  at::Tensor dq = at::zeros({p.q_tokens, p.heads, p.dim}, f32);
  at::Tensor dk = at::zeros({p.k_tokens, p.kv_heads, p.dim}, f32);
  at::Tensor dv = at::zeros({p.k_tokens, p.kv_heads, p.dim}, f32);
  const int64_t group = p.group();
  // (Hq, L, D) summed over each key/value head's query heads -> (L, Hkv, D).
  auto kv_layout = [&](const at::Tensor& x) {
    return x.view({p.kv_heads, group, x.size(1), p.dim}).sum(1).transpose(0, 1);
  };
  for (const AttentionBlock& b : p.blocks) {
    if (b.q_length == 0 || b.k_length == 0) continue;
    const auto qh = block_rows(p, q, b.q_begin, b.q_length), kh = block_rows(p, k, b.k_begin, b.k_length),
               vh = block_rows(p, v, b.k_begin, b.k_length);
    const auto doh = dout.narrow(0, b.q_begin, b.q_length).to(at::kFloat).transpose(0, 1);  // (H, Lq, D)
    const auto oh = out.narrow(0, b.q_begin, b.q_length).to(at::kFloat).transpose(0, 1);
    auto scores = at::matmul(qh, kh.transpose(1, 2)) * p.scale;
    scores = scores.masked_fill(hidden_scores(p, b, q.device()), kMinusInfinity);
    const auto row_lse = lse.narrow(1, b.q_begin, b.q_length).unsqueeze(-1);
    const auto probs = at::exp(scores - row_lse).masked_fill(at::isinf(row_lse), 0.0);
    const auto delta = (doh * oh).sum(-1, /*keepdim=*/true);                               // (H, Lq, 1)
    const auto dscores = probs * (at::matmul(doh, vh.transpose(1, 2)) - delta) * p.scale;  // (H, Lq, Lk)
    dq.narrow(0, b.q_begin, b.q_length).add_(at::matmul(dscores, kh).transpose(0, 1));
    dk.narrow(0, b.k_begin, b.k_length).add_(kv_layout(at::matmul(dscores.transpose(1, 2), qh)));
    dv.narrow(0, b.k_begin, b.k_length).add_(kv_layout(at::matmul(probs.transpose(1, 2), doh)));
  }
  return {dq, dk, dv};
}

}  // namespace loom::kernels
