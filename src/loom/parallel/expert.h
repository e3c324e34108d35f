// Token dispatch for a mixture of experts: each token's top-k picks laid out as rows grouped by
// expert (the layout kernels/grouped_mm.h takes), and the experts' rows combined back into the
// tokens, weighted by their routing weights. The groups are counted on the device.
#pragma once
#include <ATen/ATen.h>

namespace loom::parallel {

// The (token, pick) slots of T tokens with k picks each, sorted by expert. The sort is stable, so
// each expert's rows keep the tokens' order and a token's picks are combined in expert order.
struct ExpertDispatch {
  int64_t tokens = 0, top_k = 0, experts = 0;
  at::Tensor slot;    // (T * k) int64: the slot (token * k + pick) of each dispatched row
  at::Tensor token;   // (T * k) int64: the token of each dispatched row
  at::Tensor counts;  // (E) int64: rows per expert
  at::Tensor ends;    // (E) int32: the groups' ends (cumulative counts)
};

// chosen (T, k): each token's experts, in [0, experts).
ExpertDispatch dispatch_by_expert(const at::Tensor& chosen, int64_t experts);

// x (T, H) -> (T * k, H): each dispatched row's token's row.
at::Tensor dispatch_rows(const ExpertDispatch& d, const at::Tensor& x);

// rows (T * k, H) in dispatch order, weights (T, k) -> (T, H): each token's rows, each times its
// pick's weight, summed (in expert order).
at::Tensor combine_rows(const ExpertDispatch& d, const at::Tensor& rows, const at::Tensor& weights);

}  // namespace loom::parallel
