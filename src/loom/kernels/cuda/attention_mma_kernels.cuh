// Flash attention on the tensor cores for bf16 and fp16, head dimension up to 128: the same
// algorithm, tiles and masks as attention_kernels.cuh (FlashAttention-2, backward recomputing the
// probabilities from the log-sum-exp in a dq kernel and a dk/dv kernel, no atomics), with the
// score and gradient products as warp-wide 16 x 16 x 16 matrix products (simt_mma.h) accumulating
// in fp32.
//
// A block of four warps owns 64 rows of one segment and one head, 16 per warp: query rows in the
// forward and dq kernels, key rows in the dk/dv kernel. The other side streams through shared
// memory in tiles of 32 rows. The head dimension is padded with zeros to kDim (64, 80 or 128).
// Probabilities and score gradients are rounded to the inputs' dtype before they multiply values,
// keys or queries, as FlashAttention does; everything else is fp32.
//
// The forward kernel puts each score tile in shared memory, where two lanes per row take its
// maximum and exponentials. The backward kernels never need a row's reduction: they work on
// accumulator elements in place, finding each element's row and column through index fragments
// (simt_mma.h), and scatter the rounded results into shared memory as the next product's operand.
//
// Shared memory is dynamic (layouts below; the host sizes each launch from them). Device code only;
// host wrappers in attention.cu. Needs sm_80 or later (bf16 matrix products): for older
// architectures the kernels compile to a trap, and the host, which checks both the GPU and the
// code built for it, takes attention_kernels.cuh's.
#pragma once
#include "loom/kernels/cuda/namespace.h"
#include <cstddef>
#include <cstdint>

#include "loom/kernels/cuda/attention_kernels.cuh"
#include "loom/kernels/cuda/simt_mma.h"

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define LOOM_MMA_KERNELS 1
#else
#define LOOM_MMA_KERNELS 0
#endif

namespace LOOM_CUDA_NAMESPACE::flash_mma {

using flash::Geometry;
using flash::kMinusInfinity;
using flash::RunningSoftmax;
using flash::Tile;
using simt::kWarp;
using simt::mma::kTile;
namespace mma = simt::mma;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarp;  // 128
constexpr int kRows = kWarps * kTile;     // rows per block: 16 per warp
constexpr int kCols = 32;                 // streamed rows per tile
constexpr int kFloatLd = kCols + 4;       // a warp's fp32 tiles: a row of scores, 36 floats
constexpr int kHalfLd = kCols + 8;        // a warp's 16-bit tiles: a row of probabilities

// Row stride of a head-dimension tile: 8 elements (16 bytes) of padding spread rows over banks.
template <int kDim>
constexpr int ld_of() {
  return kDim + 8;
}

// Byte offsets of consecutive shared-memory arrays, each 128-byte aligned.
struct Layout {
  size_t bytes = 0;
  template <typename U>
  constexpr size_t add(size_t count) {
    const size_t at = bytes;
    bytes += (count * sizeof(U) + 127) / 128 * 128;
    return at;
  }
};

template <typename U>
LOOM_DEVICE U* at_offset(unsigned char* shared, size_t offset) {
  return reinterpret_cast<U*>(shared + offset);
}

// Forward: key and value tiles (the block's queries pass through them first), each warp's score
// and probability tiles, each row's rescale factor.
template <typename T, int kDim>
struct ForwardLayout {
  size_t keys = 0, values = 0, scores = 0, probs = 0, factors = 0, bytes = 0;
  constexpr ForwardLayout() {
    Layout l;
    keys = l.add<T>(kCols * ld_of<kDim>());
    values = l.add<T>(kCols * ld_of<kDim>());
    scores = l.add<float>(kWarps * kTile * kFloatLd);
    probs = l.add<T>(kWarps * kTile * kHalfLd);
    factors = l.add<float>(kRows);
    bytes = l.bytes;
  }
};

// dq: the block's queries and output gradients, key and value tiles, each warp's fp32 scratch and
// score-gradient tiles, each row's log-sum-exp and delta.
template <typename T, int kDim>
struct DqLayout {
  size_t queries = 0, grad_outs = 0, keys = 0, values = 0, scratch = 0, dscores = 0, lse = 0, delta = 0,
         bytes = 0;
  constexpr DqLayout() {
    Layout l;
    queries = l.add<T>(kRows * ld_of<kDim>());
    grad_outs = l.add<T>(kRows * ld_of<kDim>());
    keys = l.add<T>(kCols * ld_of<kDim>());
    values = l.add<T>(kCols * ld_of<kDim>());
    scratch = l.add<float>(kWarps * kTile * kFloatLd);
    dscores = l.add<T>(kWarps * kTile * kHalfLd);
    lse = l.add<float>(kRows);
    delta = l.add<float>(kRows);
    bytes = l.bytes;
  }
};

// dk/dv: the block's keys and values, query and output-gradient tiles, each warp's fp32 scratch,
// transposed probability and score-gradient tiles, the query tile's log-sum-exp and delta.
template <typename T, int kDim>
struct DkvLayout {
  size_t keys = 0, values = 0, queries = 0, grad_outs = 0, scratch = 0, probs = 0, dscores = 0, lse = 0,
         delta = 0, bytes = 0;
  constexpr DkvLayout() {
    Layout l;
    keys = l.add<T>(kRows * ld_of<kDim>());
    values = l.add<T>(kRows * ld_of<kDim>());
    queries = l.add<T>(kCols * ld_of<kDim>());
    grad_outs = l.add<T>(kCols * ld_of<kDim>());
    scratch = l.add<float>(kWarps * kTile * kFloatLd);
    probs = l.add<T>(kWarps * kTile * kHalfLd);
    dscores = l.add<T>(kWarps * kTile * kHalfLd);
    lse = l.add<float>(kCols);
    delta = l.add<float>(kCols);
    bytes = l.bytes;
  }
};

// Within every sm_80+ GPU's opt-in limit for a block (99 KiB on sm_86, sm_89 and sm_120).
static_assert(DqLayout<c10::BFloat16, 128>().bytes <= 99 * 1024 &&
                  DkvLayout<c10::BFloat16, 128>().bytes <= 99 * 1024,
              "shared memory beyond a block's limit");

// Rows [first, first + kCount) of one head (rows `stride` elements apart) into tile[kCount][ld],
// zeros past `limit` and from column `dim` up to kDim. Block-wide; 16 bytes a load where the rows
// allow (dim and stride multiples of 8, base 16-byte aligned: the common case), else 2.
template <int kCount, int kDim, typename T>
LOOM_DEVICE void load_rows(T* tile, const T* base, int64_t stride, int64_t first, int64_t limit,
                           int64_t dim) {
  static_assert(sizeof(T) == 2 && kDim % 8 == 0, "rows of 16-bit elements, 8 to a vector");
  constexpr int kLd = ld_of<kDim>(), kVectors = kDim / 8;
  if (dim % 8 == 0 && stride % 8 == 0 && reinterpret_cast<uintptr_t>(base) % 16 == 0) {
    for (int e = simt::thread_id(); e < kCount * kVectors; e += kThreads) {
      const int r = e / kVectors, c = e % kVectors * 8;
      T* to = tile + r * kLd + c;
      if (first + r < limit && c < dim) {
        simt::copy16(to, base + (first + r) * stride + c);
      } else {
        LOOM_UNROLL
        for (int i = 0; i < 8; ++i) to[i] = T(0.0F);
      }
    }
    return;
  }
  for (int e = simt::thread_id(); e < kCount * kDim; e += kThreads) {
    const int r = e / kDim, c = e % kDim;
    tile[r * kLd + c] = first + r < limit && c < dim ? base[(first + r) * stride + c] : T(0.0F);
  }
}

// Per-row values [first, first + kCount) of `source` into `rows`, zeros past `limit`. Block-wide.
template <int kCount>
LOOM_DEVICE void load_row_values(float* rows, const float* source, int64_t first, int64_t limit) {
  for (int r = simt::thread_id(); r < kCount; r += kThreads)
    rows[r] = first + r < limit ? source[first + r] : 0.0F;
}

// An accumulator fragment whose elements hold their own row (or column) in the tile, built through
// the warp's fp32 scratch tile.
LOOM_DEVICE void index_fragment(mma::Accumulator& index, float* scratch, bool rows) {
  const int lane = simt::thread_id() % kWarp;
  for (int e = lane; e < kTile * kTile; e += kWarp)
    scratch[(e / kTile) * kFloatLd + e % kTile] = static_cast<float>(rows ? e / kTile : e % kTile);
  simt::sync_warp();
  mma::load(index, scratch, kFloatLd);
  simt::sync_warp();
}

// s = a b^T and t = c d^T over the head dimension, for 16-row strips of head-dimension tiles: the
// scores and the output gradients' products with the values, of a query strip and a key strip (or
// transposed, of a key strip and a query strip).
template <int kDim, typename T>
LOOM_DEVICE void transposed_products(mma::Accumulator& s, const T* a, const T* b, mma::Accumulator& t,
                                     const T* c, const T* d) {
  constexpr int kLd = ld_of<kDim>();
  mma::zero(s);
  mma::zero(t);
  LOOM_UNROLL
  for (int i = 0; i < kDim / kTile; ++i) {
    mma::MatrixA<T> left;
    mma::MatrixBT<T> right;
    mma::load(left, a + i * kTile, kLd);
    mma::load(right, b + i * kTile, kLd);
    mma::multiply_add(s, left, right);
    mma::load(left, c + i * kTile, kLd);
    mma::load(right, d + i * kTile, kLd);
    mma::multiply_add(t, left, right);
  }
}

// acc += strip tile: a warp's 16 x kCols strip of probabilities or score gradients (ld kHalfLd)
// times a kCols x kDim tile of values, keys, output gradients or queries (ld ld_of<kDim>()).
template <int kDim, typename T>
LOOM_DEVICE void accumulate_products(mma::Accumulator (&acc)[kDim / kTile], const T* strip, const T* tile) {
  constexpr int kLd = ld_of<kDim>();
  LOOM_UNROLL
  for (int c = 0; c < kCols / kTile; ++c) {
    mma::MatrixA<T> left;
    mma::load(left, strip + c * kTile, kHalfLd);
    LOOM_UNROLL
    for (int d = 0; d < kDim / kTile; ++d) {
      mma::MatrixB<T> right;
      mma::load(right, tile + c * kTile * kLd + d * kTile, kLd);
      mma::multiply_add(acc[d], left, right);
    }
  }
}

// Row r of every accumulator times factors[r], rows found through the row-index fragment.
template <int kSlices>
LOOM_DEVICE void scale_rows(mma::Accumulator (&acc)[kSlices], const float* factors,
                            const mma::Accumulator& row_of) {
  LOOM_UNROLL
  for (int d = 0; d < kSlices; ++d) {
    LOOM_UNROLL
    for (int i = 0; i < mma::Accumulator::num_elements; ++i)
      acc[d].x[i] *= factors[static_cast<int>(row_of.x[i])];
  }
}

// Writes a warp's 16-row tile of accumulators, times `factor`, to rows [first, first + 16) of one
// head (rows `stride` apart) up to row `limit` and column `dim`, through the warp's fp32 scratch.
template <int kSlices, typename T>
LOOM_DEVICE void store_rows(T* base, int64_t stride, int64_t first, int64_t limit, int64_t dim,
                            mma::Accumulator (&acc)[kSlices], float factor, float* scratch) {
  const int lane = simt::thread_id() % kWarp;
  LOOM_UNROLL
  for (int s = 0; s < kSlices; ++s) {
    mma::store(scratch, acc[s], kFloatLd);
    simt::sync_warp();
    for (int e = lane; e < kTile * kTile; e += kWarp) {
      const int r = e / kTile, c = s * kTile + e % kTile;
      if (first + r < limit && c < dim)
        base[(first + r) * stride + c] = static_cast<T>(scratch[r * kFloatLd + e % kTile] * factor);
    }
    simt::sync_warp();
  }
}

// Forward: out = softmax(q k^T scale) v over the visible keys, lse = log of the softmax's sum.
// Grid (query tiles of kRows, query heads).
template <typename T, int kDim>
LOOM_KERNEL LOOM_LAUNCH_BOUNDS(kThreads, 2) void forward_kernel(const T* q, const T* k, const T* v, T* out,
                                                                float* lse, const Tile* tiles, int64_t tokens,
                                                                Geometry geo) {
#if LOOM_MMA_KERNELS
  constexpr int kLd = ld_of<kDim>(), kSlices = kDim / kTile;
  constexpr ForwardLayout<T, kDim> layout;
  static_assert(layout.values == layout.keys + kCols * kLd * sizeof(T) && kRows == 2 * kCols,
                "the key and value tiles together hold the block's queries");
  unsigned char* shared = simt::dynamic_shared();
  T* keys = at_offset<T>(shared, layout.keys);
  T* values = at_offset<T>(shared, layout.values);
  const Tile tile = tiles[simt::block_index().x];
  const int64_t head = simt::block_index().y, kv_head = head / (geo.heads / geo.kv_heads);
  const int warp = simt::thread_id() / kWarp, lane = simt::thread_id() % kWarp;
  float* scores = at_offset<float>(shared, layout.scores) + warp * kTile * kFloatLd;
  T* probs = at_offset<T>(shared, layout.probs) + warp * kTile * kHalfLd;
  float* factors = at_offset<float>(shared, layout.factors) + warp * kTile;
  const int64_t length = tile.segment_length, q_stride = geo.heads * geo.dim,
                kv_stride = geo.kv_heads * geo.dim;
  const int64_t warp_row = tile.row + warp * kTile;

  mma::Accumulator row_of;
  index_fragment(row_of, scores, true);
  load_rows<kRows, kDim>(keys, q + tile.segment_begin * q_stride + head * geo.dim, q_stride, tile.row, length,
                         geo.dim);
  simt::sync_threads();
  mma::MatrixA<T> query[kSlices];
  LOOM_UNROLL
  for (int d = 0; d < kSlices; ++d) mma::load(query[d], keys + warp * kTile * kLd + d * kTile, kLd);
  mma::Accumulator acc[kSlices];
  LOOM_UNROLL
  for (int d = 0; d < kSlices; ++d) mma::zero(acc[d]);

  // Lanes 2r and 2r + 1 take row r's softmax, the even and the odd columns.
  const int r = lane / 2, half = lane % 2;
  const int64_t row = warp_row + r;
  RunningSoftmax softmax;  // the same in both lanes of the row, the sum over the lane's columns
  const int64_t col_begin = geo.key_begin(tile.row), col_end = geo.key_end(tile.last_row(kRows), length);
  const int64_t kv_offset = tile.segment_begin * kv_stride + kv_head * geo.dim;
  for (int64_t col0 = col_begin; col0 < col_end; col0 += kCols) {
    simt::sync_threads();  // everyone is done with the previous tile (and the queries)
    load_rows<kCols, kDim>(keys, k + kv_offset, kv_stride, col0, col_end, geo.dim);
    load_rows<kCols, kDim>(values, v + kv_offset, kv_stride, col0, col_end, geo.dim);
    simt::sync_threads();
    LOOM_UNROLL
    for (int n = 0; n < kCols / kTile; ++n) {
      mma::Accumulator s;
      mma::zero(s);
      LOOM_UNROLL
      for (int d = 0; d < kSlices; ++d) {
        mma::MatrixBT<T> key;
        mma::load(key, keys + n * kTile * kLd + d * kTile, kLd);
        mma::multiply_add(s, query[d], key);
      }
      mma::store(scores + n * kTile, s, kFloatLd);
    }
    simt::sync_warp();
    float x[kCols / 2];
    float tile_max = kMinusInfinity;
    LOOM_UNROLL
    for (int i = 0; i < kCols / 2; ++i) {
      const int j = 2 * i + half;
      x[i] = geo.visible(row, col0 + j, length) ? scores[r * kFloatLd + j] * geo.scale : kMinusInfinity;
      tile_max = fmaxf(tile_max, x[i]);
    }
    tile_max = fmaxf(tile_max, simt::shuffle_xor(tile_max, 1));
    float base;
    const float rescale = softmax.next_tile(tile_max, base);
    LOOM_UNROLL
    for (int i = 0; i < kCols / 2; ++i) {
      const float p = simt::exp(x[i] - base);
      softmax.sum += p;
      probs[r * kHalfLd + 2 * i + half] = static_cast<T>(p);
    }
    if (half == 0) factors[r] = rescale;
    simt::sync_warp();
    scale_rows(acc, factors, row_of);
    accumulate_products<kDim>(acc, probs, values);
  }
  softmax.sum += simt::shuffle_xor(softmax.sum, 1);
  simt::sync_warp();  // every lane has read the last factors
  if (half == 0) {
    factors[r] = softmax.sum > 0 ? 1.0F / softmax.sum : 0.0F;
    if (row < length) lse[head * tokens + tile.segment_begin + row] = softmax.lse();
  }
  simt::sync_warp();
  scale_rows(acc, factors, row_of);
  store_rows(out + tile.segment_begin * q_stride + head * geo.dim, q_stride, warp_row, length, geo.dim, acc,
             1.0F, scores);
#else
  __trap();  // not built for this architecture: the host checks, this is the backstop
#endif
}

// dq = scale * sum_j dS_ij k_j with dS = P (dP - delta), P = exp(S - lse), dP = dout v^T.
// Grid (query tiles of kRows, query heads).
template <typename T, int kDim>
LOOM_KERNEL LOOM_LAUNCH_BOUNDS(kThreads, 2) void dq_kernel(const T* q, const T* k, const T* v, const T* dout,
                                                           const float* lse, const float* delta, T* dq,
                                                           const Tile* tiles, int64_t tokens, Geometry geo) {
#if LOOM_MMA_KERNELS
  constexpr int kLd = ld_of<kDim>(), kSlices = kDim / kTile;
  constexpr DqLayout<T, kDim> layout;
  unsigned char* shared = simt::dynamic_shared();
  T* keys = at_offset<T>(shared, layout.keys);
  T* values = at_offset<T>(shared, layout.values);
  const Tile tile = tiles[simt::block_index().x];
  const int64_t head = simt::block_index().y, kv_head = head / (geo.heads / geo.kv_heads);
  const int warp = simt::thread_id() / kWarp;
  const T* queries = at_offset<T>(shared, layout.queries) + warp * kTile * kLd;
  const T* grad_outs = at_offset<T>(shared, layout.grad_outs) + warp * kTile * kLd;
  float* scratch = at_offset<float>(shared, layout.scratch) + warp * kTile * kFloatLd;
  T* dscores = at_offset<T>(shared, layout.dscores) + warp * kTile * kHalfLd;
  const float* row_lse = at_offset<float>(shared, layout.lse) + warp * kTile;
  const float* row_delta = at_offset<float>(shared, layout.delta) + warp * kTile;
  const int64_t length = tile.segment_length, q_stride = geo.heads * geo.dim,
                kv_stride = geo.kv_heads * geo.dim;
  const int64_t q_offset = tile.segment_begin * q_stride + head * geo.dim, warp_row = tile.row + warp * kTile;

  mma::Accumulator row_of, col_of;
  index_fragment(row_of, scratch, true);
  index_fragment(col_of, scratch, false);
  load_rows<kRows, kDim>(at_offset<T>(shared, layout.queries), q + q_offset, q_stride, tile.row, length,
                         geo.dim);
  load_rows<kRows, kDim>(at_offset<T>(shared, layout.grad_outs), dout + q_offset, q_stride, tile.row, length,
                         geo.dim);
  load_row_values<kRows>(at_offset<float>(shared, layout.lse), lse + head * tokens + tile.segment_begin,
                         tile.row, length);
  load_row_values<kRows>(at_offset<float>(shared, layout.delta), delta + head * tokens + tile.segment_begin,
                         tile.row, length);
  mma::Accumulator acc[kSlices];
  LOOM_UNROLL
  for (int d = 0; d < kSlices; ++d) mma::zero(acc[d]);

  const int64_t col_begin = geo.key_begin(tile.row), col_end = geo.key_end(tile.last_row(kRows), length);
  const int64_t kv_offset = tile.segment_begin * kv_stride + kv_head * geo.dim;
  for (int64_t col0 = col_begin; col0 < col_end; col0 += kCols) {
    simt::sync_threads();
    load_rows<kCols, kDim>(keys, k + kv_offset, kv_stride, col0, col_end, geo.dim);
    load_rows<kCols, kDim>(values, v + kv_offset, kv_stride, col0, col_end, geo.dim);
    simt::sync_threads();
    LOOM_UNROLL
    for (int n = 0; n < kCols / kTile; ++n) {
      mma::Accumulator s, dp;
      transposed_products<kDim>(s, queries, keys + n * kTile * kLd, dp, grad_outs, values + n * kTile * kLd);
      LOOM_UNROLL
      for (int i = 0; i < mma::Accumulator::num_elements; ++i) {
        const int r = static_cast<int>(row_of.x[i]), c = n * kTile + static_cast<int>(col_of.x[i]);
        const bool seen = geo.visible(warp_row + r, col0 + c, length);
        const float ds = seen ? simt::exp(s.x[i] * geo.scale - row_lse[r]) * (dp.x[i] - row_delta[r]) : 0.0F;
        dscores[r * kHalfLd + c] = static_cast<T>(ds);
      }
    }
    simt::sync_warp();
    accumulate_products<kDim>(acc, dscores, keys);
  }
  store_rows(dq + q_offset, q_stride, warp_row, length, geo.dim, acc, geo.scale, scratch);
#else
  __trap();  // not built for this architecture: the host checks, this is the backstop
#endif
}

// dv_j = sum_i P_ij dout_i and dk_j = scale * sum_i dS_ij q_i over every query head of the key
// head's group. Grid (key tiles of kRows, key/value heads): the tile's rows are keys here.
template <typename T, int kDim>
LOOM_KERNEL LOOM_LAUNCH_BOUNDS(kThreads, 2) void dkv_kernel(const T* q, const T* k, const T* v, const T* dout,
                                                            const float* lse, const float* delta, T* dk,
                                                            T* dv, const Tile* tiles, int64_t tokens,
                                                            Geometry geo) {
#if LOOM_MMA_KERNELS
  constexpr int kLd = ld_of<kDim>(), kSlices = kDim / kTile;
  constexpr DkvLayout<T, kDim> layout;
  unsigned char* shared = simt::dynamic_shared();
  T* queries = at_offset<T>(shared, layout.queries);
  T* grad_outs = at_offset<T>(shared, layout.grad_outs);
  float* row_lse = at_offset<float>(shared, layout.lse);
  float* row_delta = at_offset<float>(shared, layout.delta);
  const Tile tile = tiles[simt::block_index().x];
  const int64_t kv_head = simt::block_index().y, group = geo.heads / geo.kv_heads;
  const int warp = simt::thread_id() / kWarp;
  const T* keys = at_offset<T>(shared, layout.keys) + warp * kTile * kLd;
  const T* values = at_offset<T>(shared, layout.values) + warp * kTile * kLd;
  float* scratch = at_offset<float>(shared, layout.scratch) + warp * kTile * kFloatLd;
  T* probs = at_offset<T>(shared, layout.probs) + warp * kTile * kHalfLd;
  T* dscores = at_offset<T>(shared, layout.dscores) + warp * kTile * kHalfLd;
  const int64_t length = tile.segment_length, q_stride = geo.heads * geo.dim,
                kv_stride = geo.kv_heads * geo.dim;
  const int64_t kv_offset = tile.segment_begin * kv_stride + kv_head * geo.dim,
                warp_col = tile.row + warp * kTile;

  mma::Accumulator row_of, col_of;
  index_fragment(row_of, scratch, true);
  index_fragment(col_of, scratch, false);
  load_rows<kRows, kDim>(at_offset<T>(shared, layout.keys), k + kv_offset, kv_stride, tile.row, length,
                         geo.dim);
  load_rows<kRows, kDim>(at_offset<T>(shared, layout.values), v + kv_offset, kv_stride, tile.row, length,
                         geo.dim);
  mma::Accumulator dkey[kSlices], dvalue[kSlices];
  LOOM_UNROLL
  for (int d = 0; d < kSlices; ++d) {
    mma::zero(dkey[d]);
    mma::zero(dvalue[d]);
  }

  // The tile's rows are keys: its last row is its last key.
  const int64_t row_begin = geo.query_begin(tile.row), row_end = geo.query_end(tile.last_row(kRows), length);
  for (int64_t head = kv_head * group; head < (kv_head + 1) * group; ++head) {
    const int64_t q_offset = tile.segment_begin * q_stride + head * geo.dim;
    const float* lse_head = lse + head * tokens + tile.segment_begin;
    const float* delta_head = delta + head * tokens + tile.segment_begin;
    for (int64_t row0 = row_begin; row0 < row_end; row0 += kCols) {
      simt::sync_threads();
      load_rows<kCols, kDim>(queries, q + q_offset, q_stride, row0, row_end, geo.dim);
      load_rows<kCols, kDim>(grad_outs, dout + q_offset, q_stride, row0, row_end, geo.dim);
      load_row_values<kCols>(row_lse, lse_head, row0, row_end);
      load_row_values<kCols>(row_delta, delta_head, row0, row_end);
      simt::sync_threads();
      // S^T and dP^T for the warp's 16 keys (rows) and the tile's queries (columns).
      LOOM_UNROLL
      for (int n = 0; n < kCols / kTile; ++n) {
        mma::Accumulator st, dpt;
        transposed_products<kDim>(st, keys, queries + n * kTile * kLd, dpt, values,
                                  grad_outs + n * kTile * kLd);
        LOOM_UNROLL
        for (int i = 0; i < mma::Accumulator::num_elements; ++i) {
          const int r = static_cast<int>(row_of.x[i]), j = n * kTile + static_cast<int>(col_of.x[i]);
          const bool seen = geo.visible(row0 + j, warp_col + r, length);
          const float p = seen ? simt::exp(st.x[i] * geo.scale - row_lse[j]) : 0.0F;
          probs[r * kHalfLd + j] = static_cast<T>(p);
          dscores[r * kHalfLd + j] = static_cast<T>(p * (dpt.x[i] - row_delta[j]));
        }
      }
      simt::sync_warp();
      accumulate_products<kDim>(dvalue, probs, grad_outs);
      accumulate_products<kDim>(dkey, dscores, queries);
    }
  }
  store_rows(dk + kv_offset, kv_stride, warp_col, length, geo.dim, dkey, geo.scale, scratch);
  store_rows(dv + kv_offset, kv_stride, warp_col, length, geo.dim, dvalue, 1.0F, scratch);
#else
  __trap();  // not built for this architecture: the host checks, this is the backstop
#endif
}

}  // namespace LOOM_CUDA_NAMESPACE::flash_mma
