// Context parallelism's layout of one micro-batch's tokens: which tokens each rank of the cp group
// holds, and how an attention call over them runs. The cp ranks split into Ulysses groups (consecutive
// cp ranks, exchanging heads for tokens with an all-to-all) and ring groups across them (passing key
// and value blocks around). Rank (ring r, Ulysses u) is cp rank r * ulysses + u.
//
// Each sequence (a packed sample, a batch row, a video frame) is cut into chunks over the ring:
// causal attention takes 2 x ring chunks in zig-zag order (ring rank r holds chunks r and
// 2 ring - 1 - r, so every rank has as much of the causal triangle as every other), bidirectional
// attention ring chunks in order. A sequence the chunks do not divide is padded at its end. The
// chunks of one ring rank, sequence after sequence, are its ring shard; padded at the end to a
// multiple of ulysses x align, it is cut into ulysses equal slices, one per rank of the Ulysses group.
#pragma once
#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <vector>

#include "loom/dist/comm.h"
#include "loom/kernels/attention.h"

namespace loom::parallel {

// The context-parallel groups of one rank.
struct ContextParallelGroup {
  std::shared_ptr<dist::Comm> cp, ulysses, ring;  // null where the degree is 1
  int64_t ulysses_size = 1, ring_size = 1, ulysses_rank = 0, ring_rank = 0;
  // Ring attention's calls, counted alike on every ring rank (they run the same calls in the same
  // order), so each call's message tags are its own.
  std::shared_ptr<int64_t> ring_calls = std::make_shared<int64_t>(0);

  int64_t size() const { return ulysses_size * ring_size; }
  int64_t rank() const { return ring_rank * ulysses_size + ulysses_rank; }
  bool enabled() const { return size() > 1; }
};

// `cp` (null: a degree of 1) split into Ulysses groups of `ulysses` consecutive ranks and ring
// groups across them. Every rank of cp calls it alike. ConfigError unless ulysses divides cp's size.
ContextParallelGroup context_parallel_group(std::shared_ptr<dist::Comm> cp, int64_t ulysses);

// The groups of every degree a job's steps run at, by degree: cp's whole group alone, or with
// `every_divisor` (dynamic context parallelism) also one for each divisor d of its size, of d
// consecutive cp ranks with Ulysses over gcd(d, ulysses) of them and rings across (a degree of 1: no
// group). Formed once; every rank of cp calls it alike.
std::map<int64_t, ContextParallelGroup> context_parallel_degrees(std::shared_ptr<dist::Comm> cp,
                                                                 int64_t ulysses, bool every_divisor);

struct ContextShard {
  struct Sequence {
    int64_t begin = 0, length = 0;  // its tokens on the whole axis
    int64_t chunk = 0;              // tokens per chunk, padding included
    int64_t offset = 0;             // where its chunks start in every ring shard
  };

  ContextParallelGroup group;
  bool causal = false;
  int64_t tokens = 0;        // real tokens of the whole axis
  int64_t ring_length = 0;   // tokens of a ring shard, padding included
  int64_t local_length = 0;  // this rank's: ring_length / ulysses
  std::vector<Sequence> sequences;
  int64_t rows = 0;      // > 0: a [rows, length] layout whose rows each rank holds alike (row_index)
  at::Tensor row_index;  // rows > 0: (local_length / rows,) the positions of every row held; length: padding
  at::Tensor local_index;  // (local_length,) long: the token in each slot of this rank; `tokens`: padding
  at::Tensor restore;      // (tokens,) long: each token's slot in every rank's slots, in cp rank order

  bool enabled() const { return group.enabled(); }
  // The ranges [first, first + length) of sequence i that ring rank r holds, in ring-shard order.
  std::vector<std::pair<int64_t, int64_t>> held(size_t i, int64_t r) const;
  // This rank's rows of x (dimension 0: the axis's tokens), `fill` in the padding slots. Backward:
  // the gradient of each row taken, zero elsewhere (the ranks' parts are summed with the gradients).
  at::Tensor scatter(const at::Tensor& x, double fill = 0) const;
  // Every rank's rows (local_length each, dimension 0) back in token order, the padding dropped. The
  // result feeds work every rank repeats, each for its own tokens' loss: backward sums the ranks'
  // gradients and keeps this rank's rows.
  at::Tensor gather(const at::Tensor& x) const;
  // Rows layout: this rank's positions of every row of x [rows, length, ...] (dimension 1), `fill`
  // in the padding: [rows, local_length / rows, ...].
  at::Tensor scatter_rows(const at::Tensor& x, double fill = 0) const;
};

// The layout of an axis holding `lengths` sequences one after another (zero-length ones allowed).
// `align`: the local length is a multiple of it (tp, under sequence parallelism).
ContextShard context_shard(const ContextParallelGroup& group, const std::vector<int64_t>& lengths,
                           bool causal, int64_t align = 1);

// The layout of `rows` sequences of `length` tokens each, held as a [rows, length] tensor (a batch of
// video tokens whose layers read per-row values): each rank holds the same positions of every row,
// so its shard stays [rows, local_length / rows]. Each row's ring chunk is padded to a multiple of
// ulysses x align, and the Ulysses exchange runs along the rows' token dimension.
ContextShard context_row_shard(const ContextParallelGroup& group, int64_t rows, int64_t length, bool causal,
                               int64_t align = 1);

// How one attention call over a shard's tokens runs, after the Ulysses exchange has given every rank
// of a Ulysses group its ring shard (for its share of the heads).
struct ContextAttention {
  ContextParallelGroup group;
  bool causal = false;
  int64_t rows = 0;  // > 0: a rows layout (context_row_shard): q, k, v come as [rows * per-row tokens, H, D]
  // Ring of 1: the ring shard's attention segments, each stretch of padding a segment of its own.
  std::vector<int64_t> cu_seqlens;
  // Ring of more: the blocks this rank's queries attend with the keys of ring rank s, for each s.
  std::vector<std::vector<kernels::AttentionBlock>> blocks;
};

// `segments`: cu_seqlens over the axis's tokens, each segment within one sequence of the shard
// (windows or frames of the vision tower); causal attention's segments must be the shard's sequences.
// ModelError otherwise.
ContextAttention context_attention_plan(const ContextShard& shard, const std::vector<int64_t>& segments);

}  // namespace loom::parallel
