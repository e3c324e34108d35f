// Token dispatch for a mixture of experts: each token's top-k picks laid out as rows grouped by
// expert (the layout kernels/grouped_mm.h takes), and the experts' rows combined back into the
// tokens, weighted by their routing weights. The groups are counted on the device.
#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <memory>

#include "loom/dist/comm.h"

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

// chosen (T, k): each token's experts, in [0, experts). `kept` (T, k) bool, when given: only those
// picks are dispatched (the others are dropped: their tokens go without them).
ExpertDispatch dispatch_by_expert(const at::Tensor& chosen, int64_t experts, const at::Tensor& kept = {});

// An expert capacity: the picks (T, k) kept when each expert computes at most `capacity` rows, those
// of highest `priority` (T, k; ties to the earlier token), as a bool (T, k) mask.
at::Tensor within_capacity(const at::Tensor& chosen, const at::Tensor& priority, int64_t experts,
                           int64_t capacity);

// The capacity of each expert for T tokens with k picks each: ceil(factor * T * k / experts).
int64_t expert_capacity(double factor, int64_t tokens, int64_t top_k, int64_t experts);

// x (T, H) -> (T * k, H): each dispatched row's token's row.
at::Tensor dispatch_rows(const ExpertDispatch& d, const at::Tensor& x);

// rows (T * k, H) in dispatch order, weights (T, k) -> (T, H): each token's rows, each times its
// pick's weight, summed (in expert order).
at::Tensor combine_rows(const ExpertDispatch& d, const at::Tensor& rows, const at::Tensor& weights);

// The experts over the dispatched rows (T * k, H), grouped by expert: `experts` (rows grouped by
// this rank's experts, their ends) -> its outputs, row for row. With `ep` (expert parallelism,
// null or one rank: none) the experts are split over its ranks in equal consecutive blocks: each
// row goes to the rank holding its expert (an all-to-all of unequal splits, whose sizes the ranks
// first exchange from the device's counts), the rows a rank receives are regrouped by its experts,
// and the outputs go back the same way. Differentiable; every rank of `ep` calls it together.
at::Tensor exchange_with_experts(
    const ExpertDispatch& d, const at::Tensor& rows, const std::shared_ptr<dist::Comm>& ep,
    const std::function<at::Tensor(const at::Tensor& rows, const at::Tensor& ends)>& experts);

}  // namespace loom::parallel
