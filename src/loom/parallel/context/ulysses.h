// Ulysses (DeepSpeed-Ulysses): before attention an all-to-all over the Ulysses group trades this
// rank's tokens of every head for the ring shard's tokens of its share of the heads; after it, the
// inverse. Each rank then attends over whole (ring-shard) sequences with any kernel.
#pragma once
#include <ATen/ATen.h>

#include "loom/parallel/context/shard.h"

namespace loom::parallel {

// x (local_length, H, D) -> (ring_length, H / ulysses, D), this rank's heads in order. ModelError
// when ulysses does not divide H. With `rows` > 0 (a rows layout), the tokens are [rows, per-row]
// and each row's are exchanged along it.
at::Tensor ulysses_to_heads(const at::Tensor& x, const ContextParallelGroup& group, int64_t rows = 0);

// Keys or values (local_length, Hkv, D) alike, grouped-query aware: fewer heads than the Ulysses
// degree are repeated so each rank receives the one its query heads read (Hkv must divide the
// degree then; backward sums the copies' gradients).
at::Tensor ulysses_kv_to_heads(const at::Tensor& x, const ContextParallelGroup& group, int64_t rows = 0);

// The inverse of ulysses_to_heads: (ring_length, H / ulysses, D) -> (local_length, H, D).
at::Tensor ulysses_to_sequence(const at::Tensor& x, const ContextParallelGroup& group, int64_t rows = 0);

}  // namespace loom::parallel
