// Sequence parallelism at the edges of a stack of blocks: between the blocks' tensor-parallel
// regions each rank keeps one chunk of the sequence. The per-micro-batch part (which tokens are
// padding, the rotary tables and segment lists padded to match) is worked out once before the
// first layer; the first layer of the stack scatters its output, the last gathers its input.
#pragma once
#include <ATen/ATen.h>

#include <vector>

#include "loom/parallel/tensor.h"

namespace loom::parallel {

struct SequenceChunks {
  bool split = false;  // false: sequence parallelism is off (or tp is 1) and nothing changes
  int64_t length = 0;  // the real tokens along the split dimension
  int64_t padded = 0;  // length rounded up to a multiple of tp
};

// How a sequence of `length` tokens splits over tp's ranks. A length tp does not divide is padded
// at the end.
SequenceChunks sequence_chunks(const TensorParallelGroup& tp, int64_t length);

// The rotary cos and sin (which keep the tokens' sequence layout along `dim`) padded as the tokens
// are, with angle 0, and each non-empty cu_seqlens list in `segments` given the padding as a
// segment of its own (an empty list means causal rows, where no real token sees a later one
// anyway), so no real token attends to the padding.
void pad_sequence_tables(const SequenceChunks& chunks, int64_t dim, at::Tensor& cos, at::Tensor& sin,
                         const std::vector<std::vector<int64_t>*>& segments);

// This rank's chunk of x along `dim` (x padded with zeros first).
at::Tensor scatter_sequence(const TensorParallelGroup& tp, int64_t dim, const at::Tensor& x,
                            const SequenceChunks& chunks);

// After the blocks: every rank's chunk gathered, the padding cut off.
at::Tensor gather_sequence(const TensorParallelGroup& tp, int64_t dim, const at::Tensor& x,
                           const SequenceChunks& chunks);

}  // namespace loom::parallel
