#include "loom/train/schedule.h"

#include <algorithm>
#include <cmath>

namespace loom::train {

double learning_rate(int64_t step, int64_t total_steps, int64_t warmup_steps, double max_lr, double min_lr) {
  if (step < warmup_steps) return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - std::max<int64_t>(0, warmup_steps));
  const double progress = std::clamp(
      static_cast<double>(step - std::max<int64_t>(0, warmup_steps)) / static_cast<double>(decay_steps), 0.0,
      1.0);
  return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

namespace {

// Scales every gradient by max_norm / norm when the norm exceeds max_norm (and is finite).
void clip_to(const std::vector<at::Tensor>& grads, double norm, double max_norm) {
  if (max_norm > 0.0 && std::isfinite(norm) && norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);
    for (const auto& g : grads) g.mul_(scale);
  }
}

// The squared 2-norms of params' gradients (fp64, one host sync), summed into [whole, split]:
// whole those with share 0 (or no shares given), split the others times their share.
std::pair<double, double> squared_norms(const std::vector<at::Tensor>& params,
                                        const std::vector<double>& share, std::vector<at::Tensor>& grads) {
  std::vector<at::Tensor> norms;  // one fp32 scalar per grad
  std::vector<double> shares;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& g = params[i].grad();
    if (!g.defined()) continue;
    grads.push_back(g);
    norms.push_back(at::norm(g, 2, at::kFloat));
    shares.push_back(share.empty() ? 0.0 : share[i]);
  }
  if (grads.empty()) return {0.0, 0.0};
  const auto squares = at::stack(norms).to(at::kDouble).pow(2);
  if (share.empty()) return {squares.sum().item<double>(), 0.0};
  const auto weights = at::tensor(shares, at::kDouble).to(squares.device());
  const auto whole = weights.eq(0.0);
  const auto sums =
      at::stack({squares.masked_fill(whole.logical_not(), 0.0).sum(), (squares * weights).sum()});
  return {sums[0].item<double>(), sums[1].item<double>()};
}

}  // namespace

double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  const auto [whole, split] = squared_norms(params, {}, grads);
  const double norm = std::sqrt(whole + split);
  clip_to(grads, norm, max_norm);
  return norm;
}

double clip_grad_norm(const std::vector<at::Tensor>& params, const std::vector<double>& share,
                      dist::Comm& group, double max_norm) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  const auto [whole, split_sum] = squared_norms(params, share, grads);
  auto total = at::tensor({split_sum}, at::kDouble);
  group.all_reduce_sum({total});
  const double norm = std::sqrt(whole + total.item<double>());
  clip_to(grads, norm, max_norm);
  return norm;
}

double clip_grad_norm(const std::vector<at::Tensor>& params, const std::vector<double>& share,
                      dist::Comm& group, const std::vector<double>& second_share, dist::Comm& second,
                      double max_norm) {
  at::NoGradGuard no_grad;
  // Each parameter's squares in one of three sums: whole, over `group`, over `second`.
  std::vector<at::Tensor> parts[3];
  std::vector<double> weights[3];
  std::vector<at::Tensor> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& g = params[i].grad();
    if (!g.defined()) continue;
    grads.push_back(g);
    const size_t sum = second_share[i] > 0 ? 2 : share[i] > 0 ? 1 : 0;
    parts[sum].push_back(at::norm(g, 2, at::kFloat));
    weights[sum].push_back(sum == 2 ? second_share[i] : sum == 1 ? share[i] : 1.0);
  }
  double totals[3] = {0, 0, 0};
  for (size_t sum = 0; sum < 3; ++sum)
    if (!parts[sum].empty())
      totals[sum] = (at::stack(parts[sum]).to(at::kDouble).pow(2) *
                     at::tensor(weights[sum], at::kDouble).to(parts[sum].front().device()))
                        .sum()
                        .item<double>();
  auto over_group = at::tensor({totals[1]}, at::kDouble), over_second = at::tensor({totals[2]}, at::kDouble);
  group.all_reduce_sum({over_group});
  second.all_reduce_sum({over_second});
  const double norm = std::sqrt(totals[0] + over_group.item<double>() + over_second.item<double>());
  clip_to(grads, norm, max_norm);
  return norm;
}

double clip_grad_norm(const std::vector<at::Tensor>& params, const std::vector<double>& share,
                      const std::vector<bool>& counted, dist::Comm* tensor_parallel, dist::Comm& pipeline,
                      double max_norm) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> kept;
  std::vector<double> kept_share;
  for (size_t i = 0; i < params.size(); ++i)
    if (counted[i]) {
      kept.push_back(params[i]);
      if (!share.empty()) kept_share.push_back(share[i]);
    }
  std::vector<at::Tensor> kept_grads;
  const auto [whole, split_sum] = squared_norms(kept, kept_share, kept_grads);
  auto split = at::tensor({split_sum}, at::kDouble);
  if (tensor_parallel) tensor_parallel->all_reduce_sum({split});
  auto total = at::tensor({whole + split.item<double>()}, at::kDouble);
  pipeline.all_reduce_sum({total});
  const double norm = std::sqrt(total.item<double>());
  std::vector<at::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  clip_to(grads, norm, max_norm);
  return norm;
}

}  // namespace loom::train
