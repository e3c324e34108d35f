// Autograd-aware collectives for tensor and sequence parallelism (Megatron's mappings): each
// pairs a forward collective over a group with its dual in the backward pass, so a model written
// with them differentiates through the communication. With a null group or one of size 1 each
// is the identity.
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "loom/dist/comm.h"

namespace loom::dist {

// Enters a tensor-parallel region whose ranks each use the whole of x: forward the identity,
// backward the sum of the ranks' gradients.
at::Tensor copy_to_region(const at::Tensor& x, const std::shared_ptr<Comm>& group);

// Leaves a region whose ranks each hold a partial sum: forward the all-reduced sum, backward
// the identity.
at::Tensor reduce_from_region(const at::Tensor& x, const std::shared_ptr<Comm>& group);

// A statistic summed from every rank's part that each rank then applies to its own slice (a norm over
// a width cut over the group): forward the all-reduced sum, backward the sum of the ranks' gradients,
// since each rank's use of the sum reaches every part.
at::Tensor sum_over_region(const at::Tensor& x, const std::shared_ptr<Comm>& group);

// Keeps this rank's chunk of `dim` (size() equal chunks, rank order); backward gathers them.
at::Tensor scatter_to_region(const at::Tensor& x, const std::shared_ptr<Comm>& group, int64_t dim);

// Concatenates every rank's x along `dim` in rank order; backward keeps this rank's chunk.
at::Tensor gather_from_region(const at::Tensor& x, const std::shared_ptr<Comm>& group, int64_t dim);

// Sequence parallelism: the whole sequence from every rank's chunk of `dim`; backward sums the
// ranks' gradients and keeps this rank's chunk (a reduce-scatter), since every rank's use of the
// whole sequence contributes to each chunk's gradient.
at::Tensor gather_from_sequence_region(const at::Tensor& x, const std::shared_ptr<Comm>& group, int64_t dim);

// Sequence parallelism: the sum of the ranks' partial x, of which this rank keeps its chunk of
// `dim` (a reduce-scatter); backward gathers the chunks' gradients.
at::Tensor reduce_scatter_to_sequence_region(const at::Tensor& x, const std::shared_ptr<Comm>& group,
                                             int64_t dim);

// Rows to every rank in unequal counts (MoE dispatch and combine): x's first input_splits[0] rows
// go to rank 0, the next input_splits[1] to rank 1, ...; the result holds output_splits[i] rows
// from rank i, in rank order (Comm::all_to_all). Backward sends each row's gradient back where the
// row came from: the same exchange with the splits swapped.
at::Tensor all_to_all(const at::Tensor& x, const std::shared_ptr<Comm>& group,
                      std::vector<int64_t> output_splits, std::vector<int64_t> input_splits);

// all_to_all, started: `rows` (differentiable as all_to_all's result, the backward exchange made
// when backward reaches it) fills once `work` is waited on (null: nothing to wait for); read nothing
// of it before. The caller computes what does not need the rows in between.
struct StartedRows {
  at::Tensor rows;
  std::unique_ptr<PendingWork> work;
};
StartedRows start_all_to_all(const at::Tensor& x, const std::shared_ptr<Comm>& group,
                             std::vector<int64_t> output_splits, std::vector<int64_t> input_splits);

// Ulysses' exchange (DeepSpeed's _SeqAllToAll): x, whole along scatter_dim, is cut into size()
// equal chunks along it, chunk j goes to rank j, and the chunks received are concatenated along
// gather_dim in rank order. So a rank's shard of gather_dim becomes its shard of scatter_dim:
// (b, s/P, h, d) with scatter_dim 2 and gather_dim 1 -> (b, s, h/P, d). Backward is the inverse,
// the same exchange with the two dimensions swapped.
at::Tensor all_to_all_reshard(const at::Tensor& x, const std::shared_ptr<Comm>& group, int64_t scatter_dim,
                              int64_t gather_dim);

// The two collectives with no autograd of their own, along any dimension (the mappings' parts,
// also used to gather and split whole parameters). `dim` must hold size() equal chunks.
at::Tensor all_gather_along(const at::Tensor& x, Comm& group, int64_t dim);
at::Tensor reduce_scatter_along(const at::Tensor& x, Comm& group, int64_t dim);

}  // namespace loom::dist
