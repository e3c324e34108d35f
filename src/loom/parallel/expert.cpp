#include "loom/parallel/expert.h"

#include <fmt/format.h>

#include "loom/util/errors.h"

namespace loom::parallel {

ExpertDispatch dispatch_by_expert(const at::Tensor& chosen, int64_t experts) {
  if (chosen.dim() != 2)
    throw ModelError(fmt::format("expert dispatch: the picks must be (tokens, k), got [{}]",
                                 fmt::join(chosen.sizes(), ", ")));
  ExpertDispatch d;
  d.tokens = chosen.size(0);
  d.top_k = chosen.size(1);
  d.experts = experts;
  const at::Tensor flat = chosen.flatten().to(at::kLong);
  d.slot = std::get<1>(at::sort(flat, /*stable=*/std::optional<bool>(true), /*dim=*/0, /*descending=*/false));
  d.token = at::floor_divide(d.slot, d.top_k);
  d.counts = at::bincount(flat, /*weights=*/{}, experts);
  if (d.counts.size(0) != experts)
    throw ModelError(
        fmt::format("expert dispatch: a pick names expert {} of {}", d.counts.size(0) - 1, experts));
  d.ends = d.counts.cumsum(0).to(at::kInt);
  return d;
}

at::Tensor dispatch_rows(const ExpertDispatch& d, const at::Tensor& x) { return x.index_select(0, d.token); }

at::Tensor combine_rows(const ExpertDispatch& d, const at::Tensor& rows, const at::Tensor& weights) {
  const at::Tensor scale = weights.flatten().index_select(0, d.slot).unsqueeze(1).to(rows.scalar_type());
  return at::zeros({d.tokens, rows.size(1)}, rows.options()).index_add(0, d.token, rows * scale);
}

}  // namespace loom::parallel
