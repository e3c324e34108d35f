// The grouped matrix product of a mixture of experts: every local expert over its own rows of one
// permuted batch, in one call. Rows are grouped by expert (parallel/expert.h permutes them so):
// group e is rows [ends[e - 1], ends[e]) of x, ends[-1] = 0.
#pragma once
#include <ATen/ATen.h>

namespace loom::kernels {

// x (M, K), w (E, N, K) (each expert's weight as a linear layer stores it, out x in), ends (E)
// int32 on x's device, nondecreasing to M -> (M, N): row m of group e is w[e] x_m. An empty group
// is no rows (its weight's gradient is zero). Differentiable in x and w; x and w of one dtype.
// ModelError for bad ends, except on a GPU in the grouped product's path, which trusts them (a
// check would wait for the device): parallel::dispatch_by_expert makes them.
//
// It is PyTorch's grouped product (at::_grouped_mm: CUTLASS's grouped GEMM for bf16 on sm90 and
// later, one product per group elsewhere) where the rows and weights meet its alignment (K and N
// times the element size multiples of 16 bytes), else one product per group here; both forms give
// the same values. The backward pass is two more grouped products: dx = dy w per group, and
// dw[e] = dy_e^T x_e.
at::Tensor grouped_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& ends);

// The reference: one at::matmul per group, differentiable by autograd.
at::Tensor grouped_mm_loop(const at::Tensor& x, const at::Tensor& w, const at::Tensor& ends);

}  // namespace loom::kernels
