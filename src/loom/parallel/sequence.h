// Sequence parallelism at the edges of a stack of blocks: between the blocks' tensor-parallel
// regions each rank keeps one chunk of the sequence.
#pragma once
#include <ATen/ATen.h>

#include <vector>

#include "loom/parallel/tensor.h"

namespace loom::parallel {

struct SequenceChunks {
  bool split = false;  // false: sequence parallelism is off (or tp is 1) and nothing changed
  int64_t length = 0;  // the real tokens along the split dimension
};

// Keeps this rank's chunk of x along `dim` for the blocks. A length tp does not divide is padded at
// the end: x with zeros, the rotary cos and sin (which keep x's sequence layout along `dim`) with
// angle 0, and each non-empty cu_seqlens list in `segments` gains the padding as a segment of its
// own (an empty list means causal rows, where no real token sees a later one anyway), so no real
// token attends to the padding.
SequenceChunks enter_sequence_parallel(const TensorParallelGroup& tp, int64_t dim, at::Tensor& x,
                                       at::Tensor& cos, at::Tensor& sin,
                                       const std::vector<std::vector<int64_t>*>& segments);

// After the blocks: every rank's chunk gathered, the padding cut off.
at::Tensor leave_sequence_parallel(const TensorParallelGroup& tp, int64_t dim, const at::Tensor& x,
                                   const SequenceChunks& chunks);

}  // namespace loom::parallel
