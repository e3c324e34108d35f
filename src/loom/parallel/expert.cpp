#include "loom/parallel/expert.h"

#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "loom/dist/mappings.h"
#include "loom/util/errors.h"

namespace loom::parallel {

ExpertDispatch dispatch_by_expert(const at::Tensor& chosen, int64_t experts, const at::Tensor& kept) {
  if (chosen.dim() != 2)
    throw ModelError(fmt::format("expert dispatch: the picks must be (tokens, k), got [{}]",
                                 fmt::join(chosen.sizes(), ", ")));
  if (kept.defined() && kept.sizes() != chosen.sizes())
    throw ModelError(fmt::format("expert dispatch: the kept picks are [{}], the picks [{}]",
                                 fmt::join(kept.sizes(), ", "), fmt::join(chosen.sizes(), ", ")));
  ExpertDispatch d;
  d.tokens = chosen.size(0);
  d.top_k = chosen.size(1);
  d.experts = experts;
  // The dispatched slots in token order (all, or the kept), then stably sorted by expert.
  at::Tensor slots = kept.defined() ? kept.flatten().nonzero().flatten()
                                    : at::arange(chosen.numel(), chosen.options().dtype(at::kLong));
  const at::Tensor flat = chosen.flatten().to(at::kLong).index_select(0, slots);
  d.slot = slots.index_select(
      0, std::get<1>(at::sort(flat, /*stable=*/std::optional<bool>(true), /*dim=*/0, /*descending=*/false)));
  d.token = at::floor_divide(d.slot, d.top_k);
  d.counts = at::bincount(flat, /*weights=*/{}, experts);
  if (d.counts.size(0) != experts)
    throw ModelError(
        fmt::format("expert dispatch: a pick names expert {} of {}", d.counts.size(0) - 1, experts));
  d.ends = d.counts.cumsum(0).to(at::kInt);
  return d;
}

at::Tensor within_capacity(const at::Tensor& chosen, const at::Tensor& priority, int64_t experts,
                           int64_t capacity) {
  const at::Tensor flat = chosen.flatten().to(at::kLong);
  // The slots by priority (highest first; stable: the earlier token first among equals), then stably
  // by expert: each expert's picks in the order they keep their place.
  const at::Tensor by_priority = std::get<1>(
      at::sort(priority.flatten(), /*stable=*/std::optional<bool>(true), /*dim=*/0, /*descending=*/true));
  const at::Tensor expert_of = flat.index_select(0, by_priority);
  const at::Tensor order =
      by_priority.index_select(0, std::get<1>(at::sort(expert_of, /*stable=*/std::optional<bool>(true),
                                                       /*dim=*/0, /*descending=*/false)));
  const at::Tensor counts = at::bincount(flat, /*weights=*/{}, experts);
  const at::Tensor starts = counts.cumsum(0) - counts;
  const at::Tensor place =
      at::arange(flat.numel(), flat.options()) - starts.index_select(0, flat.index_select(0, order));
  return at::zeros({flat.numel()}, chosen.options().dtype(at::kBool))
      .index_put_({order}, place.lt(capacity))
      .view(chosen.sizes());
}

int64_t expert_capacity(double factor, int64_t tokens, int64_t top_k, int64_t experts) {
  return static_cast<int64_t>(
      std::ceil(factor * static_cast<double>(tokens * top_k) / static_cast<double>(experts)));
}

at::Tensor dispatch_rows(const ExpertDispatch& d, const at::Tensor& x) { return x.index_select(0, d.token); }

at::Tensor combine_rows(const ExpertDispatch& d, const at::Tensor& rows, const at::Tensor& weights) {
  const at::Tensor scale = weights.flatten().index_select(0, d.slot).unsqueeze(1).to(rows.scalar_type());
  return at::zeros({d.tokens, rows.size(1)}, rows.options()).index_add(0, d.token, rows * scale);
}

at::Tensor exchange_with_experts(
    const ExpertDispatch& d, const at::Tensor& rows, const std::shared_ptr<dist::Comm>& ep,
    const std::function<at::Tensor(const at::Tensor& rows, const at::Tensor& ends)>& experts) {
  if (!ep || ep->size() == 1) return experts(rows, d.ends);
  const int64_t ranks = ep->size(), local = d.experts / ranks;
  if (d.experts % ranks != 0)
    throw ModelError(fmt::format("expert parallelism: {} ranks do not split {} experts", ranks, d.experts));
  // Rows per (destination rank, its expert), and per (source rank, this rank's expert): one
  // exchange of the counts, then to the host for the splits.
  const at::Tensor sent_counts = d.counts.to(at::kCPU).contiguous();
  at::Tensor received_counts = at::empty({d.experts}, sent_counts.options());
  ep->all_to_all(sent_counts, received_counts, std::vector<int64_t>(ranks, local),
                 std::vector<int64_t>(ranks, local));
  const at::Tensor by_source = received_counts.view({ranks, local});
  std::vector<int64_t> send_splits(ranks), receive_splits(ranks);
  for (int64_t r = 0; r < ranks; ++r) {
    send_splits[r] = sent_counts.narrow(0, r * local, local).sum().item<int64_t>();
    receive_splits[r] = by_source[r].sum().item<int64_t>();
  }
  const at::Tensor received = dist::all_to_all(rows, ep, receive_splits, send_splits);
  // From each source, its rows for this rank's experts in expert order: regrouped by expert
  // (stable: by source, then token order, within an expert).
  const at::Tensor expert_of_row =
      at::arange(local, at::kLong).repeat({ranks}).repeat_interleave(received_counts).to(rows.device());
  const at::Tensor order = std::get<1>(
      at::sort(expert_of_row, /*stable=*/std::optional<bool>(true), /*dim=*/0, /*descending=*/false));
  const at::Tensor ends = by_source.sum(0).cumsum(0).to(at::kInt).to(rows.device());
  const at::Tensor out = experts(received.index_select(0, order), ends);
  const at::Tensor inverse =
      at::empty_like(order).scatter_(0, order, at::arange(order.numel(), order.options()));
  return dist::all_to_all(out.index_select(0, inverse), ep, send_splits, receive_splits);
}

}  // namespace loom::parallel
