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
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  std::vector<at::Tensor> norms;  // one fp32 scalar per grad
  for (const auto& p : params) {
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    grads.push_back(g);
    norms.push_back(at::norm(g, 2, at::kFloat).to(grads.front().device()));
  }
  if (grads.empty()) return 0.0;
  // sqrt(sum_i norm_i^2), accumulated in fp64: one host sync for all grads.
  const double norm = at::stack(norms).to(at::kDouble).pow(2).sum().sqrt().item<double>();
  if (max_norm > 0.0 && std::isfinite(norm) && norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);
    for (auto& g : grads) g.mul_(scale);
  }
  return norm;
}

}  // namespace loom::train
