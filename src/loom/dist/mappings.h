// Autograd-aware collectives for tensor and sequence parallelism (Megatron's mappings): each
// pairs a forward collective over a group with its dual in the backward pass, so a model written
// with them differentiates through the communication. With a null group or one of size 1 each
// is the identity.
#pragma once
#include <ATen/ATen.h>

#include <memory>

#include "loom/dist/comm.h"

namespace loom::dist {

// Enters a tensor-parallel region whose ranks each use the whole of x: forward the identity,
// backward the sum of the ranks' gradients.
at::Tensor copy_to_region(const at::Tensor& x, const std::shared_ptr<Comm>& group);

// Leaves a region whose ranks each hold a partial sum: forward the all-reduced sum, backward
// the identity.
at::Tensor reduce_from_region(const at::Tensor& x, const std::shared_ptr<Comm>& group);

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

// The two collectives with no autograd of their own, along any dimension (the mappings' parts,
// also used to gather and split whole parameters). `dim` must hold size() equal chunks.
at::Tensor all_gather_along(const at::Tensor& x, Comm& group, int64_t dim);
at::Tensor reduce_scatter_along(const at::Tensor& x, Comm& group, int64_t dim);

}  // namespace loom::dist
