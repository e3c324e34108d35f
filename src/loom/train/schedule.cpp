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

double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm) {
  const double norm = std::sqrt(gradient_square(params, {}, nullptr));
  clip_gradients_to(params, norm, max_norm);
  return norm;
}

double gradient_square(const std::vector<at::Tensor>& params, const std::vector<NormShare>& shares,
                       dist::Comm* pipeline) {
  at::NoGradGuard no_grad;
  // The counted gradients' squares, and the groups they sum over (null first: the whole ones).
  std::vector<at::Tensor> norms;  // one fp32 scalar per grad
  std::vector<size_t> group_of;   // index into groups
  std::vector<double> weights;
  std::vector<std::shared_ptr<dist::Comm>> groups{nullptr};
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& g = params[i].grad();
    const NormShare share = shares.empty() ? NormShare{} : shares[i];
    if (!g.defined() || !share.counted) continue;
    norms.push_back(at::norm(g, 2, at::kFloat));
    const auto it = std::find(groups.begin(), groups.end(), share.group);
    group_of.push_back(static_cast<size_t>(it - groups.begin()));
    if (it == groups.end()) groups.push_back(share.group);
    weights.push_back(share.group ? share.weight : 1.0);
  }
  double total = 0.0;
  if (!norms.empty()) {
    const auto squares = at::stack(norms).to(at::kDouble).pow(2);
    // Each group's sum over the whole vector, the others' entries weighted 0 (one host sync).
    std::vector<at::Tensor> sums;
    for (size_t k = 0; k < groups.size(); ++k) {
      std::vector<double> in_group(weights.size(), 0.0);
      for (size_t j = 0; j < weights.size(); ++j)
        if (group_of[j] == k) in_group[j] = weights[j];
      const auto w = at::tensor(in_group, at::kDouble).to(squares.device());
      sums.push_back(k == 0 ? squares.masked_fill(w.eq(0.0), 0.0).sum() : (squares * w).sum());
    }
    const auto local = at::stack(sums).to(at::kCPU);
    total = local[0].item<double>();
    for (size_t k = 1; k < groups.size(); ++k) {
      auto over = at::tensor({local[static_cast<int64_t>(k)].item<double>()}, at::kDouble);
      groups[k]->all_reduce_sum({over});
      total += over.item<double>();
    }
  }
  if (pipeline) {
    auto stages = at::tensor({total}, at::kDouble);
    pipeline->all_reduce_sum({stages});
    total = stages.item<double>();
  }
  return total;
}

void clip_gradients_to(const std::vector<at::Tensor>& params, double norm, double max_norm) {
  at::NoGradGuard no_grad;
  if (max_norm > 0.0 && std::isfinite(norm) && norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);
    for (const auto& p : params)
      if (p.grad().defined()) p.grad().mul_(scale);
  }
}

}  // namespace loom::train
