#include "loom/kernels/adamw.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "loom/kernels/cpu/adamw_loops.h"
#include "loom/util/errors.h"

namespace loom::kernels {
namespace {

constexpr int64_t kTaskElements = 1 << 15;

void check(const AdamWTensor& t, size_t index) {
  if (t.residual.defined()) {
    const auto n = t.bf16_param.defined() ? t.bf16_param.numel() : int64_t{-1};
    const bool ok =
        !t.weight.defined() && t.ties && n >= 0 && t.bf16_param.is_cpu() &&
        t.bf16_param.scalar_type() == at::kBFloat16 && t.bf16_param.is_contiguous() && t.residual.is_cpu() &&
        t.residual.scalar_type() == at::kShort && t.residual.is_contiguous() && t.residual.numel() == n &&
        t.exp_avg.is_cpu() && t.exp_avg.scalar_type() == at::kFloat && t.exp_avg.is_contiguous() &&
        t.exp_avg.numel() == n && t.exp_avg_sq.is_cpu() && t.exp_avg_sq.scalar_type() == at::kFloat &&
        t.exp_avg_sq.is_contiguous() && t.exp_avg_sq.numel() == n && t.grad.is_cpu() &&
        t.grad.is_contiguous() && t.grad.numel() == n &&
        (t.grad.scalar_type() == at::kFloat || t.grad.scalar_type() == at::kBFloat16);
    if (!ok)
      throw ModelError(
          fmt::format("adamw_step: split tensor {} needs CPU tensors: no fp32 weight, a contiguous bf16 "
                      "parameter, int16 residual and tie list, fp32 moments and an fp32 or bf16 gradient, "
                      "all of {} elements",
                      index, n));
    return;
  }
  const auto n = t.weight.numel();
  const bool on_cpu = t.weight.is_cpu() && t.exp_avg.is_cpu() && t.exp_avg_sq.is_cpu() && t.grad.is_cpu() &&
                      (!t.bf16_param.defined() || t.bf16_param.is_cpu());
  const bool ok = on_cpu && t.weight.scalar_type() == at::kFloat && t.weight.is_contiguous() &&
                  t.exp_avg.scalar_type() == at::kFloat && t.exp_avg.is_contiguous() &&
                  t.exp_avg.numel() == n && t.exp_avg_sq.scalar_type() == at::kFloat &&
                  t.exp_avg_sq.is_contiguous() && t.exp_avg_sq.numel() == n && t.grad.is_contiguous() &&
                  t.grad.numel() == n &&
                  (t.grad.scalar_type() == at::kFloat || t.grad.scalar_type() == at::kBFloat16) &&
                  (!t.bf16_param.defined() || (t.bf16_param.scalar_type() == at::kBFloat16 &&
                                               t.bf16_param.is_contiguous() && t.bf16_param.numel() == n));
  if (!ok)
    throw ModelError(
        fmt::format("adamw_step: tensor {} needs CPU tensors: a contiguous fp32 weight and moments, an fp32 "
                    "or bf16 gradient and an "
                    "optional bf16 parameter, all of {} elements",
                    index, n));
}

}  // namespace

void adamw_step(const std::vector<AdamWTensor>& tensors, const AdamWHyper& h) {
  cpu::AdamWScalars s;
  s.decay_factor = static_cast<float>(1.0 - h.lr * h.weight_decay);
  s.b1 = static_cast<float>(h.beta1);
  s.one_minus_b1 = static_cast<float>(1.0 - h.beta1);
  s.b2 = static_cast<float>(h.beta2);
  s.one_minus_b2 = static_cast<float>(1.0 - h.beta2);
  s.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(h.beta2, static_cast<double>(h.step))));
  s.eps = static_cast<float>(h.eps);
  s.step_size = static_cast<float>(h.lr / (1.0 - std::pow(h.beta1, static_cast<double>(h.step))));
  // Tasks of up to kTaskElements, cut across the tensors so small tensors share a task and large
  // ones spread over the threads.
  struct Task {
    size_t tensor;
    int64_t begin, end;
  };
  std::vector<Task> tasks;
  for (size_t i = 0; i < tensors.size(); ++i) {
    check(tensors[i], i);
    const int64_t n = tensors[i].exp_avg.numel();
    for (int64_t begin = 0; begin < n; begin += kTaskElements)
      tasks.push_back({i, begin, std::min(n, begin + kTaskElements)});
  }
  // A split weight's new tie indices, per task, joined in task order (so sorted) once all are done.
  std::vector<std::vector<int64_t>> task_ties(tasks.size());
  at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t first, int64_t last) {
    for (int64_t k = first; k < last; ++k) {
      const Task& task = tasks[static_cast<size_t>(k)];
      const AdamWTensor& t = tensors[task.tensor];
      const int64_t b = task.begin, n = task.end - task.begin;
      float* m = t.exp_avg.data_ptr<float>() + b;
      float* v = t.exp_avg_sq.data_ptr<float>() + b;
      const bool decay = t.decay && h.weight_decay != 0.0;
      cpu::AdamWGrad g;
      if (t.grad.scalar_type() == at::kBFloat16)
        g.g16 = reinterpret_cast<const uint16_t*>(t.grad.data_ptr<at::BFloat16>()) + b;
      else
        g.g32 = t.grad.data_ptr<float>() + b;
      if (t.residual.defined()) {
        const std::vector<int64_t>& ties = *t.ties;
        const auto from = std::lower_bound(ties.begin(), ties.end(), b);
        const auto to = std::lower_bound(from, ties.end(), task.end);
        cpu::adamw_update_split(reinterpret_cast<uint16_t*>(t.bf16_param.data_ptr<at::BFloat16>()) + b,
                                t.residual.data_ptr<int16_t>() + b, ties.data() + (from - ties.begin()),
                                ties.data() + (to - ties.begin()), task_ties[static_cast<size_t>(k)], b, g, m,
                                v, n, s, decay);
        continue;
      }
      uint16_t* param = t.bf16_param.defined()
                            ? reinterpret_cast<uint16_t*>(t.bf16_param.data_ptr<at::BFloat16>()) + b
                            : nullptr;
      cpu::adamw_update(t.weight.data_ptr<float>() + b, g, m, v, param, n, s, decay);
    }
  });
  for (size_t k = 0; k < tasks.size();) {
    const AdamWTensor& t = tensors[tasks[k].tensor];
    const size_t tensor = tasks[k].tensor;
    if (t.residual.defined()) t.ties->clear();
    for (; k < tasks.size() && tasks[k].tensor == tensor; ++k)
      if (t.residual.defined()) t.ties->insert(t.ties->end(), task_ties[k].begin(), task_ties[k].end());
  }
}

void adamw_step_composite(const AdamWTensor& t, const AdamWHyper& h) {
  if (t.residual.defined())
    throw ModelError("adamw_step_composite: the composite form updates an fp32 weight, not a split one");
  at::NoGradGuard no_grad;
  const at::Tensor g = t.grad.to(at::kFloat);
  at::Tensor w = t.weight;
  if (t.decay && h.weight_decay != 0.0) w.mul_(1.0 - h.lr * h.weight_decay);
  const double bias_correction1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.step));
  const double sqrt_bias_correction2 = std::sqrt(1.0 - std::pow(h.beta2, static_cast<double>(h.step)));
  t.exp_avg.mul_(h.beta1).add_(g, 1.0 - h.beta1);
  t.exp_avg_sq.mul_(h.beta2).addcmul_(g, g, 1.0 - h.beta2);
  const at::Tensor denom = t.exp_avg_sq.sqrt().div_(sqrt_bias_correction2).add_(h.eps);
  w.addcdiv_(t.exp_avg, denom, -h.lr / bias_correction1);
  if (t.bf16_param.defined()) t.bf16_param.copy_(w);
}

}  // namespace loom::kernels
