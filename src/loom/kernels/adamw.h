// AdamW's update fused into one pass per element, over many tensors at once (multi-tensor): the
// composite form makes about seven passes per tensor (scale and add the first moment, scale and
// multiply-add the second, square root, divide, add eps, multiply-divide into the weight), each
// over the whole tensor; the fused form reads weight, gradient and moments once and writes them
// once, in tasks of equal size cut across the tensors, threaded with at::parallel_for and compiled
// for the CPU's vector width. Same arithmetic as the composite, in fp32.
#pragma once
#include <ATen/ATen.h>

#include <vector>

namespace loom::kernels {

struct AdamWHyper {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0;  // decoupled: w *= 1 - lr * weight_decay first, where `decay` says so
  int64_t step = 1;         // 1-based, for the bias corrections
};

// One tensor of the update: the fp32 weight, its gradient (fp32 or bf16), both fp32 moments (all
// contiguous, of equal size), whether it decays, and a bf16 parameter to receive the rounded weight
// (undefined when the weight is the parameter).
//
// Or, with `residual` defined (int16, the parameter's size) and `weight` undefined, a split fp32
// weight: the bf16 parameter is its high half and `residual` its low (cpu::bf16_residual), with
// `ties` the sorted indices whose residual is +0x8000. The update reads and writes the three, and
// is bit for bit the one an fp32 weight would get.
struct AdamWTensor {
  at::Tensor weight, grad, exp_avg, exp_avg_sq;
  bool decay = false;
  at::Tensor bf16_param;
  at::Tensor residual;
  std::vector<int64_t>* ties = nullptr;
};

void adamw_step(const std::vector<AdamWTensor>& tensors, const AdamWHyper& hyper);

// The composite form, one tensor (the reference).
void adamw_step_composite(const AdamWTensor& tensor, const AdamWHyper& hyper);

}  // namespace loom::kernels
