#include "loom/parallel/cross_entropy.h"

#include "loom/dist/mappings.h"

namespace loom::parallel {

at::Tensor vocab_parallel_cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels,
                                            const std::shared_ptr<dist::Comm>& group, int64_t vocab_start,
                                            int64_t ignore_index) {
  const int64_t local_vocab = logits.size(-1);
  const auto z = logits.reshape({-1, local_vocab}).to(at::kFloat);
  const auto y = labels.reshape({-1}).to(at::kLong);
  // The largest logit of each token over the whole vocabulary, for a stable exp; it cancels
  // out of the loss, so no gradient flows through it.
  at::Tensor shift;
  {
    at::NoGradGuard no_grad;
    shift = std::get<0>(z.detach().max(-1));
    if (group && group->size() > 1)
      shift = std::get<0>(dist::all_gather_along(shift.unsqueeze(0), *group, 0).max(0));
  }
  const auto shifted = z - shift.unsqueeze(-1);
  const auto sum_exp = dist::reduce_from_region(shifted.exp().sum(-1), group);
  // The label's logit lives on one rank; the others contribute zero.
  const auto local = y - vocab_start;
  const auto mine = (local >= 0).logical_and(local < local_vocab).logical_and(y != ignore_index);
  const auto picked = shifted.gather(1, local.clamp(0, local_vocab - 1).unsqueeze(1))
                          .squeeze(1)
                          .masked_fill(mine.logical_not(), 0.0);
  const auto target = dist::reduce_from_region(picked, group);
  const auto counted = (y != ignore_index);
  return (sum_exp.log() - target).masked_fill(counted.logical_not(), 0.0).sum();
}

}  // namespace loom::parallel
