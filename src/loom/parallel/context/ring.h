// Ring attention (Liu et al.; the zig-zag balance of Llama 3's and TransformerEngine's context
// parallelism): each ring rank keeps its queries and passes its key/value block around the ring, one
// hop per step, the next block's transfer started before the current one's attention so the two
// overlap. Partial results are merged with their log-sum-exp. The backward pass passes the
// key/value blocks around again, with their gradients travelling behind them, so no rank ever holds
// more than two blocks of keys and values.
#pragma once
#include <ATen/ATen.h>

#include "loom/parallel/context/shard.h"

namespace loom::parallel {

// q (S, Hq, D), k and v (S, Hkv, D): this rank's ring shard (its Ulysses share of the heads) ->
// (S, Hq, D), attending as plan.blocks say. Differentiable in q, k and v.
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const ContextAttention& plan);

// Where this process's ring attention spent its time since the last reset (loom bench's figures).
struct RingStats {
  double compute_s = 0;            // attention over the blocks, merging the partial results
  double wait_s = 0;               // blocked on a message after the step's compute: communication not hidden
  int64_t bytes = 0;               // sent
  int64_t messages = 0;            // sent
  std::weak_ptr<dist::Comm> ring;  // the ring the messages went around (not kept alive by this)
};
const RingStats& ring_stats();
void reset_ring_stats();
// The same number of messages, of the mean size, sent around the same ring with nothing to hide
// behind (every rank of the ring calls it alike): the seconds the communication takes alone, the
// denominator of the hidden share. 0 without messages.
double time_ring_messages_alone();

}  // namespace loom::parallel
