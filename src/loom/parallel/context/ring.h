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

}  // namespace loom::parallel
