// Flash attention on CUDA, FlashAttention-2's algorithm with fp32 arithmetic on the CUDA cores: for
// fp32, head dimensions above 128 and GPUs before sm_80 (bf16 and fp16 up to 128 take the tensor
// cores, attention_mma_kernels.cuh).
//
// A block owns a tile of kRows rows of one segment and one head: query rows in the forward pass
// and in the dq pass, key rows in the dk/dv pass. Each row is worked by a group of kGroup adjacent
// lanes, lane g holding elements g, g + kGroup, ... of the head dimension in registers (kSlice of
// them), so a dot product is kSlice multiply-adds and a 3-step butterfly within the group. The
// other side (keys and values, or queries and output gradients) streams through shared memory in
// tiles of kCols rows; tiles that the segment bounds, causality or the window hide entirely are
// never visited. The backward pass runs two kernels that each recompute the probabilities from the
// saved log-sum-exp: one per query tile for dq, one per key tile for dk and dv (looping over the
// query heads that share the key head), so every output element is written by one block, without
// atomics, and the results do not depend on scheduling.
//
// Device code only (simt.h primitives, no ATen): it also compiles for the CPU emulator and in the
// device-code check (scripts/check-cuda-device-code.sh). Host wrappers: attention.cu.
#pragma once
#include "loom/kernels/cuda/namespace.h"
#include <cstdint>
#include <limits>

#include "loom/kernels/cuda/simt.h"

namespace LOOM_CUDA_NAMESPACE::flash {

constexpr int kGroup = 8;                 // lanes per row
constexpr int kRows = 32;                 // rows per block
constexpr int kThreads = kRows * kGroup;  // 256
constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();

// Blocks an SM should hold at once: register budgets for ptxas. At two blocks (128 registers a
// thread) the forward kernel never spills, the dq kernel does not up to head dimension 128, and
// the dk/dv kernel spills 24 bytes (reloading 40) at 65-128 (sm_90, CUDA 13); the backward
// kernels of the widest slice keep one block and up to 255 registers, which do not spill
// (scripts/check-cuda-device-code.sh prints these counts).
template <int kSlice>
constexpr int blocks_per_sm() {
  return kSlice <= 16 ? 2 : 1;
}

// Streamed rows per shared-memory tile: two tiles of kCols x (kGroup * kSlice) fp32 fit in 32 KiB.
template <int kSlice>
constexpr int cols_for() {
  return kSlice <= 16 ? 32 : 16;
}

// One tile of rows of one segment: the segment's first token and length, and the tile's first row
// within the segment. Built on the host, in the order blocks take them.
struct Tile {
  int32_t segment_begin, segment_length, row;
  // The last row within the segment of a tile of `rows` rows.
  LOOM_DEVICE int64_t last_row(int rows) const {
    return (row + rows < segment_length ? row + rows : segment_length) - 1;
  }
};

// One row's online softmax over streamed tiles: the running maximum of its visible scores and the
// sum of their exponentials against it.
struct RunningSoftmax {
  float max = kMinusInfinity, sum = 0;
  // Moves on to a tile whose visible scores peak at tile_max: returns the factor that the sum
  // (rescaled here) and the row's accumulators take, and sets `base`, the exponent base of the
  // tile's probabilities. While nothing is visible yet the maximum is -inf; exponents are then
  // taken against 0, which leaves every probability (and the zero accumulators) at 0.
  LOOM_DEVICE float next_tile(float tile_max, float& base) {
    const float new_max = fmaxf(max, tile_max);
    base = new_max == kMinusInfinity ? 0.0F : new_max;
    const float rescale = simt::exp(max - base);
    sum *= rescale;
    max = new_max;
    return rescale;
  }
  LOOM_DEVICE float lse() const { return max + simt::log(sum); }
};

struct Geometry {
  int64_t heads, kv_heads, dim;
  float scale;
  bool causal;
  int64_t window;  // 0: none

  // Keys [key_begin, key_end) of a segment of `length` that query `row` sees.
  LOOM_DEVICE int64_t key_begin(int64_t row) const {
    return window > 0 ? (row - window + 1 > 0 ? row - window + 1 : 0) : 0;
  }
  LOOM_DEVICE int64_t key_end(int64_t row, int64_t length) const {
    const int64_t end = causal ? row + 1 : (window > 0 ? row + window : length);
    return end < length ? end : length;
  }
  // Queries [query_begin, query_end) that see key `col`.
  LOOM_DEVICE int64_t query_begin(int64_t col) const {
    if (causal) return col;
    return window > 0 ? (col - window + 1 > 0 ? col - window + 1 : 0) : 0;
  }
  LOOM_DEVICE int64_t query_end(int64_t col, int64_t length) const {
    return window > 0 ? (col + window < length ? col + window : length) : length;
  }
  LOOM_DEVICE bool visible(int64_t row, int64_t col, int64_t length) const {
    return row < length && col >= key_begin(row) && col < key_end(row, length);
  }
};

// Loads rows [first, first + count) of one head of a (T, H, D) tensor into tile[kCols][width] as
// fp32 times `factor`, zeros past `limit` (the end of what may be read) and past D.
template <int kCols, int kWidth, typename T>
LOOM_DEVICE void load_tile(float (*tile)[kWidth], const T* base, int64_t row_stride, int64_t first,
                           int64_t limit, int64_t dim, float factor) {
  for (int e = simt::thread_id(); e < kCols * kWidth; e += kThreads) {
    const int r = e / kWidth, c = e % kWidth;
    tile[r][c] =
        first + r < limit && c < dim ? static_cast<float>(base[(first + r) * row_stride + c]) * factor : 0.0F;
  }
}

// x . row over the head dimension, this lane holding x's elements lane + i * kGroup: the lane's
// partial products summed over its group (every lane of the group gets the dot product).
template <int kSlice>
LOOM_DEVICE float group_dot(const float (&x)[kSlice], const float* row, int lane) {
  float partial = 0;
  LOOM_UNROLL
  for (int i = 0; i < kSlice; ++i) partial += x[i] * row[lane + i * kGroup];
  return simt::group_sum<kGroup>(partial);
}

// acc += factor * row over this lane's elements of the head dimension.
template <int kSlice>
LOOM_DEVICE void add_scaled(float (&acc)[kSlice], float factor, const float* row, int lane) {
  LOOM_UNROLL
  for (int i = 0; i < kSlice; ++i) acc[i] += factor * row[lane + i * kGroup];
}

// What one thread of a block works on: row `row` of the tile's segment (the last tile's spare
// rows lie past the segment's end and only take part in the block's barriers and shuffles), its
// token, and its lane within the row's group.
struct TileRow {
  Tile tile;
  int64_t row, token;
  int lane;
  LOOM_DEVICE explicit TileRow(const Tile* tiles)
      : tile(tiles[simt::block_index().x]),
        row(tile.row + simt::thread_id() / kGroup),
        token(tile.segment_begin + row),
        lane(simt::thread_id() % kGroup) {}
  LOOM_DEVICE bool inside() const { return row < tile.segment_length; }
  // The tile's last row within the segment.
  LOOM_DEVICE int64_t last_row() const { return tile.last_row(kRows); }
};

// This lane's elements of one head's row (at `base`) in registers as fp32 times `factor`; zeros
// for a row outside the segment and past D.
template <int kSlice, typename T>
LOOM_DEVICE void load_row(float (&x)[kSlice], const T* base, bool inside, int lane, int64_t dim,
                          float factor) {
  LOOM_UNROLL
  for (int i = 0; i < kSlice; ++i) {
    const int64_t c = lane + i * kGroup;
    x[i] = inside && c < dim ? static_cast<float>(base[c]) * factor : 0.0F;
  }
}

template <int kSlice, typename T>
LOOM_DEVICE void store_row(T* base, const float (&x)[kSlice], float factor, int lane, int64_t dim) {
  LOOM_UNROLL
  for (int i = 0; i < kSlice; ++i) {
    const int64_t c = lane + i * kGroup;
    if (c < dim) base[c] = static_cast<T>(x[i] * factor);
  }
}

// Keys and values [col0, col0 + kCols) of one key/value head of the segment into shared memory
// (zeros from col_end), once every thread is done with the previous tile.
template <int kCols, int kWidth, typename T>
LOOM_DEVICE void load_keys_values(float (*keys)[kWidth], float (*values)[kWidth], const T* k, const T* v,
                                  const TileRow& at, int64_t kv_head, const Geometry& geo, int64_t col0,
                                  int64_t col_end) {
  const int64_t stride = geo.kv_heads * geo.dim, offset = at.tile.segment_begin * stride + kv_head * geo.dim;
  simt::sync_threads();
  load_tile<kCols, kWidth>(keys, k + offset, stride, col0, col_end, geo.dim, 1.0F);
  load_tile<kCols, kWidth>(values, v + offset, stride, col0, col_end, geo.dim, 1.0F);
  simt::sync_threads();
}

// Forward: out = softmax(q k^T scale) v over the visible keys, lse = log of the softmax's sum.
// Grid (query tiles, query heads).
template <typename T, int kSlice>
LOOM_KERNEL LOOM_LAUNCH_BOUNDS(kThreads, 2) void attention_forward_kernel(const T* q, const T* k, const T* v,
                                                                          T* out, float* lse,
                                                                          const Tile* tiles, int64_t tokens,
                                                                          Geometry geo) {
  constexpr int kWidth = kGroup * kSlice, kCols = cols_for<kSlice>();
  LOOM_SHARED float keys[kCols][kWidth];
  LOOM_SHARED float values[kCols][kWidth];
  const TileRow at(tiles);
  const int64_t head = simt::block_index().y, kv_head = head / (geo.heads / geo.kv_heads);
  const int64_t length = at.tile.segment_length, row_offset = at.token * geo.heads * geo.dim + head * geo.dim;
  float query[kSlice], acc[kSlice] = {};
  load_row(query, q + row_offset, at.inside(), at.lane, geo.dim, geo.scale);
  RunningSoftmax softmax;

  const int64_t col_begin = geo.key_begin(at.tile.row), col_end = geo.key_end(at.last_row(), length);
  for (int64_t col0 = col_begin; col0 < col_end; col0 += kCols) {
    load_keys_values<kCols, kWidth>(keys, values, k, v, at, kv_head, geo, col0, col_end);
    float scores[kCols];
    float tile_max = kMinusInfinity;
    LOOM_UNROLL
    for (int j = 0; j < kCols; ++j) {
      const float score = group_dot(query, keys[j], at.lane);
      scores[j] = geo.visible(at.row, col0 + j, length) ? score : kMinusInfinity;
      tile_max = fmaxf(tile_max, scores[j]);
    }
    float base;
    const float rescale = softmax.next_tile(tile_max, base);
    LOOM_UNROLL
    for (int i = 0; i < kSlice; ++i) acc[i] *= rescale;
    LOOM_UNROLL
    for (int j = 0; j < kCols; ++j) {
      const float p = simt::exp(scores[j] - base);
      softmax.sum += p;
      add_scaled(acc, p, values[j], at.lane);
    }
  }
  if (!at.inside()) return;
  store_row(out + row_offset, acc, 1.0F / softmax.sum, at.lane, geo.dim);
  if (at.lane == 0) lse[head * tokens + at.token] = softmax.lse();
}

// dq = scale * sum_j dS_ij k_j with dS = P (dP - delta), P = exp(S - lse), dP = dout v^T.
// Grid (query tiles, query heads).
template <typename T, int kSlice>
LOOM_KERNEL LOOM_LAUNCH_BOUNDS(kThreads, blocks_per_sm<kSlice>()) void attention_dq_kernel(
    const T* q, const T* k, const T* v, const T* dout, const float* lse, const float* delta, T* dq,
    const Tile* tiles, int64_t tokens, Geometry geo) {
  constexpr int kWidth = kGroup * kSlice, kCols = cols_for<kSlice>();
  LOOM_SHARED float keys[kCols][kWidth];
  LOOM_SHARED float values[kCols][kWidth];
  const TileRow at(tiles);
  const int64_t head = simt::block_index().y, kv_head = head / (geo.heads / geo.kv_heads);
  const int64_t length = at.tile.segment_length, row_offset = at.token * geo.heads * geo.dim + head * geo.dim;
  float query[kSlice], grad_out[kSlice], acc[kSlice] = {};
  load_row(query, q + row_offset, at.inside(), at.lane, geo.dim, geo.scale);
  load_row(grad_out, dout + row_offset, at.inside(), at.lane, geo.dim, 1.0F);
  const float row_lse = at.inside() ? lse[head * tokens + at.token] : 0.0F;
  const float row_delta = at.inside() ? delta[head * tokens + at.token] : 0.0F;

  const int64_t col_begin = geo.key_begin(at.tile.row), col_end = geo.key_end(at.last_row(), length);
  for (int64_t col0 = col_begin; col0 < col_end; col0 += kCols) {
    load_keys_values<kCols, kWidth>(keys, values, k, v, at, kv_head, geo, col0, col_end);
    LOOM_UNROLL
    for (int j = 0; j < kCols; ++j) {
      const float score = group_dot(query, keys[j], at.lane), dp = group_dot(grad_out, values[j], at.lane);
      const bool seen = geo.visible(at.row, col0 + j, length);
      const float ds = seen ? simt::exp(score - row_lse) * (dp - row_delta) : 0.0F;
      add_scaled(acc, ds, keys[j], at.lane);
    }
  }
  if (at.inside()) store_row(dq + row_offset, acc, geo.scale, at.lane, geo.dim);
}

// dv_j = sum_i P_ij dout_i and dk_j = scale * sum_i dS_ij q_i over every query head of the key
// head's group. Grid (key tiles, key/value heads): the tile's rows are keys here.
template <typename T, int kSlice>
LOOM_KERNEL LOOM_LAUNCH_BOUNDS(kThreads, blocks_per_sm<kSlice>()) void attention_dkv_kernel(
    const T* q, const T* k, const T* v, const T* dout, const float* lse, const float* delta, T* dk, T* dv,
    const Tile* tiles, int64_t tokens, Geometry geo) {
  constexpr int kWidth = kGroup * kSlice, kCols = cols_for<kSlice>();
  LOOM_SHARED float queries[kCols][kWidth];
  LOOM_SHARED float grad_outs[kCols][kWidth];
  LOOM_SHARED float row_lse[kCols];
  LOOM_SHARED float row_delta[kCols];
  const TileRow at(tiles);
  const int64_t kv_head = simt::block_index().y, group = geo.heads / geo.kv_heads;
  const int64_t length = at.tile.segment_length, col = at.row;
  const int64_t q_stride = geo.heads * geo.dim,
                col_offset = at.token * geo.kv_heads * geo.dim + kv_head * geo.dim;
  float key[kSlice], value[kSlice], dkey[kSlice] = {}, dvalue[kSlice] = {};
  load_row(key, k + col_offset, at.inside(), at.lane, geo.dim, 1.0F);
  load_row(value, v + col_offset, at.inside(), at.lane, geo.dim, 1.0F);

  const int64_t row_begin = geo.query_begin(at.tile.row), row_end = geo.query_end(at.last_row(), length);
  for (int64_t head = kv_head * group; head < (kv_head + 1) * group; ++head) {
    const T* q_head = q + at.tile.segment_begin * q_stride + head * geo.dim;
    const T* dout_head = dout + at.tile.segment_begin * q_stride + head * geo.dim;
    const float* lse_head = lse + head * tokens + at.tile.segment_begin;
    const float* delta_head = delta + head * tokens + at.tile.segment_begin;
    for (int64_t row0 = row_begin; row0 < row_end; row0 += kCols) {
      simt::sync_threads();
      load_tile<kCols, kWidth>(queries, q_head, q_stride, row0, row_end, geo.dim, geo.scale);
      load_tile<kCols, kWidth>(grad_outs, dout_head, q_stride, row0, row_end, geo.dim, 1.0F);
      for (int r = simt::thread_id(); r < kCols; r += kThreads) {
        row_lse[r] = row0 + r < row_end ? lse_head[row0 + r] : 0.0F;
        row_delta[r] = row0 + r < row_end ? delta_head[row0 + r] : 0.0F;
      }
      simt::sync_threads();
      LOOM_UNROLL
      for (int j = 0; j < kCols; ++j) {
        const float score = group_dot(key, queries[j], at.lane), dp = group_dot(value, grad_outs[j], at.lane);
        const bool seen = at.inside() && geo.visible(row0 + j, col, length);
        const float p = seen ? simt::exp(score - row_lse[j]) : 0.0F;
        const float ds = p * (dp - row_delta[j]);
        add_scaled(dvalue, p, grad_outs[j], at.lane);
        add_scaled(dkey, ds, queries[j], at.lane);  // the queries carry the scale
      }
    }
  }
  if (!at.inside()) return;
  store_row(dk + col_offset, dkey, 1.0F, at.lane, geo.dim);
  store_row(dv + col_offset, dvalue, 1.0F, at.lane, geo.dim);
}

}  // namespace LOOM_CUDA_NAMESPACE::flash
