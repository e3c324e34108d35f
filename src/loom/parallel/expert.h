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

// How the dispatched rows reach the experts: `ep` (null or one rank: every expert on this rank)
// splits the experts over its ranks in equal consecutive blocks. replicate_above > 0 (hot-expert
// replication, MindSpeed's "move the parameters to the data"): when the rows some ep rank would compute
// are over that many times the mean over the ranks, its hottest expert is copied for the pass to the
// least loaded rank, with part of that expert's rows (whole sources' rows, up to half the two ranks'
// difference), and so on while a rank is over it (at most ep - 1 copies).
struct ExpertExchange {
  std::shared_ptr<dist::Comm> ep;
  double replicate_above = 0.0;
};

// The rows ep ranks computed in one exchange: the most on a rank with every expert at its owner, the
// most after replication, and the mean (the same on every rank of the group).
struct ExchangeLoad {
  double most_before = 0.0, most = 0.0, mean = 0.0;
};

// The experts' computation: rows grouped by expert (`ends`, the groups' ends), each group through
// the experts' `weights` of the same index (each tensor (groups, ...)) -> its outputs, row for row.
using ExpertCompute = std::function<at::Tensor(const at::Tensor& rows, const at::Tensor& ends,
                                               const std::vector<at::Tensor>& weights)>;

// The experts over the dispatched rows (T * k, H), grouped by expert: `weights` are this rank's
// experts' (E / ep of them each). Under expert parallelism each row goes to the rank computing its
// expert (an all-to-all of unequal splits, whose sizes come from every rank's counts, gathered once),
// the rows a rank receives are regrouped by its experts (then the copies it holds, whose weights come
// from their owners), and the outputs go back the same way. Differentiable (a copy's gradient adds
// to its owner's); every rank of `ep` calls it together. `in_flight` (when given) runs once, while
// the rows travel to the experts (without ep: before the experts): the work that does not need
// them, such as the shared expert. `load`, when given, receives the ranks' rows.
at::Tensor exchange_with_experts(const ExpertDispatch& d, const at::Tensor& rows,
                                 const ExpertExchange& exchange, const std::vector<at::Tensor>& weights,
                                 const ExpertCompute& experts, const std::function<void()>& in_flight = {},
                                 ExchangeLoad* load = nullptr);

// Where this process's expert layers spent their time since the last reset (loom bench's figures).
// The forward exchanges only: the backward's run inside autograd.
struct ExpertStats {
  double compute_s = 0;  // the experts' grouped products
  double flops = 0;      // theirs
  int64_t rows = 0;      // the rows this rank's experts (and copies) computed
  double wait_s = 0;     // blocked on the exchanges (for the dispatch, after in_flight's work)
  int64_t bytes = 0;     // sent and received
  int64_t exchanges = 0;
  std::weak_ptr<dist::Comm> ep;  // the group the rows went over (not kept alive by this)
};
const ExpertStats& expert_stats();
void reset_expert_stats();
// The same number of exchanges, of the mean size split evenly, over the same group with nothing to
// hide behind (every rank of the group calls it alike): the seconds the communication takes alone,
// the denominator of the hidden share. 0 without exchanges.
double time_expert_messages_alone();

}  // namespace loom::parallel
