// Cross-entropy over logits split along the vocabulary by tensor parallelism (Megatron's
// vocab-parallel cross-entropy): each rank holds its slice of every token's logits, and only
// per-token scalars cross the group, never the full logits.
#pragma once
#include <ATen/ATen.h>

#include <memory>

#include "loom/dist/comm.h"

namespace loom::parallel {

// The sum over tokens whose label is not `ignore_index` of -log softmax(logits)[label], where
// logits (..., V/size) are this rank's columns [vocab_start, vocab_start + V/size) of the
// vocabulary and labels (...) are int64 ids into the whole vocabulary. Computed in fp32; the
// result (a scalar) is the same on every rank, and its gradient reaches this rank's logits.
// A null group means the logits are the whole vocabulary.
at::Tensor vocab_parallel_cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels,
                                            const std::shared_ptr<dist::Comm>& group, int64_t vocab_start,
                                            int64_t ignore_index = -100);

}  // namespace loom::parallel
