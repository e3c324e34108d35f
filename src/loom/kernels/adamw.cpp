#include "loom/kernels/adamw.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>

#include "loom/kernels/cpu/vector.h"
#include "loom/util/errors.h"

namespace loom::kernels {
namespace {

constexpr int64_t kTaskElements = 1 << 15;

struct Scalars {
  float decay_factor, b1, one_minus_b1, b2, one_minus_b2, inv_sqrt_bc2, eps, step_size;
};

// One pass over n elements; grad in fp32.
LOOM_VECTOR_CLONES void update_f32(float* w, const float* g, float* m, float* v, int64_t n, Scalars s,
                                   bool decay) {
  for (int64_t i = 0; i < n; ++i) {
    float wi = decay ? w[i] * s.decay_factor : w[i];
    const float mi = m[i] * s.b1 + g[i] * s.one_minus_b1;
    const float vi = v[i] * s.b2 + g[i] * g[i] * s.one_minus_b2;
    wi -= s.step_size * (mi / (std::sqrt(vi) * s.inv_sqrt_bc2 + s.eps));
    m[i] = mi;
    v[i] = vi;
    w[i] = wi;
  }
}

// The same with a bf16 gradient and, optionally, the rounded weight written to a bf16 parameter.
LOOM_VECTOR_CLONES void update_mixed(float* w, const uint16_t* g16, const float* g32, float* m, float* v,
                                     uint16_t* param, int64_t n, Scalars s, bool decay) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g16 ? cpu::from_bf16(g16[i]) : g32[i];
    float wi = decay ? w[i] * s.decay_factor : w[i];
    const float mi = m[i] * s.b1 + gi * s.one_minus_b1;
    const float vi = v[i] * s.b2 + gi * gi * s.one_minus_b2;
    wi -= s.step_size * (mi / (std::sqrt(vi) * s.inv_sqrt_bc2 + s.eps));
    m[i] = mi;
    v[i] = vi;
    w[i] = wi;
    if (param) param[i] = cpu::to_bf16(wi);
  }
}

void check(const AdamWTensor& t, size_t index) {
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
  Scalars s;
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
    const int64_t n = tensors[i].weight.numel();
    for (int64_t begin = 0; begin < n; begin += kTaskElements)
      tasks.push_back({i, begin, std::min(n, begin + kTaskElements)});
  }
  at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t first, int64_t last) {
    for (int64_t k = first; k < last; ++k) {
      const Task& task = tasks[static_cast<size_t>(k)];
      const AdamWTensor& t = tensors[task.tensor];
      const int64_t b = task.begin, n = task.end - task.begin;
      float* w = t.weight.data_ptr<float>() + b;
      float* m = t.exp_avg.data_ptr<float>() + b;
      float* v = t.exp_avg_sq.data_ptr<float>() + b;
      const bool decay = t.decay && h.weight_decay != 0.0;
      if (t.grad.scalar_type() == at::kFloat && !t.bf16_param.defined()) {
        update_f32(w, t.grad.data_ptr<float>() + b, m, v, n, s, decay);
        continue;
      }
      const uint16_t* g16 = t.grad.scalar_type() == at::kBFloat16
                                ? reinterpret_cast<const uint16_t*>(t.grad.data_ptr<at::BFloat16>()) + b
                                : nullptr;
      const float* g32 = g16 ? nullptr : t.grad.data_ptr<float>() + b;
      uint16_t* param = t.bf16_param.defined()
                            ? reinterpret_cast<uint16_t*>(t.bf16_param.data_ptr<at::BFloat16>()) + b
                            : nullptr;
      update_mixed(w, g16, g32, m, v, param, n, s, decay);
    }
  });
}

void adamw_step_composite(const AdamWTensor& t, const AdamWHyper& h) {
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
