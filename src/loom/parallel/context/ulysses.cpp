#include "loom/parallel/context/ulysses.h"

#include <fmt/format.h>

#include "loom/dist/mappings.h"
#include "loom/util/errors.h"

namespace loom::parallel {
namespace {

// (tokens, H, D) as (rows, tokens / rows, H, D) for a rows layout.
at::Tensor by_rows(const at::Tensor& x, int64_t rows) { return x.view({rows, -1, x.size(1), x.size(2)}); }

}  // namespace

at::Tensor ulysses_to_heads(const at::Tensor& x, const ContextParallelGroup& group, int64_t rows) {
  if (group.ulysses_size == 1) return x;
  if (x.size(1) % group.ulysses_size != 0)
    throw ModelError(
        fmt::format("parallel.cp_ulysses={}: {} attention heads (per tensor-parallel rank) do not "
                    "split evenly over the Ulysses ranks",
                    group.ulysses_size, x.size(1)));
  if (rows > 0)
    return dist::all_to_all_reshard(by_rows(x, rows), group.ulysses, /*scatter_dim=*/2, /*gather_dim=*/1)
        .flatten(0, 1);
  return dist::all_to_all_reshard(x, group.ulysses, /*scatter_dim=*/1, /*gather_dim=*/0);
}

at::Tensor ulysses_kv_to_heads(const at::Tensor& x, const ContextParallelGroup& group, int64_t rows) {
  const int64_t heads = x.size(1), degree = group.ulysses_size;
  if (degree > heads && degree % heads == 0)
    return ulysses_to_heads(x.repeat_interleave(degree / heads, 1), group, rows);
  if (degree > 1 && heads % degree != 0)
    throw ModelError(
        fmt::format("parallel.cp_ulysses={}: {} key/value heads (per tensor-parallel rank) neither "
                    "split evenly over the Ulysses ranks nor divide them",
                    degree, heads));
  return ulysses_to_heads(x, group, rows);
}

at::Tensor ulysses_to_sequence(const at::Tensor& x, const ContextParallelGroup& group, int64_t rows) {
  if (group.ulysses_size == 1) return x;
  if (rows > 0)
    return dist::all_to_all_reshard(by_rows(x, rows), group.ulysses, /*scatter_dim=*/1, /*gather_dim=*/2)
        .flatten(0, 1);
  return dist::all_to_all_reshard(x, group.ulysses, /*scatter_dim=*/0, /*gather_dim=*/1);
}

}  // namespace loom::parallel
