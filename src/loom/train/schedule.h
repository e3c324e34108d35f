// Learning-rate schedule (linear warmup, then cosine decay) and global gradient-norm clipping.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "loom/dist/comm.h"

namespace loom::train {

// Learning rate for the 0-based step about to run: max_lr*(step+1)/warmup_steps while
// step < warmup_steps, then cosine from max_lr down to min_lr over the remaining steps
// (progress = (step-warmup)/max(1, total-warmup), held at min_lr past total_steps).
double learning_rate(int64_t step, int64_t total_steps, int64_t warmup_steps, double max_lr, double min_lr);

// Global L2 norm of the grads of `params` (those without a grad are skipped), computed in fp32 per
// tensor and summed in fp64. When max_norm > 0 and the norm exceeds it, every grad is scaled by
// max_norm/(norm+1e-6). A non-finite norm is returned without scaling, for the caller to act on.
double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm);

// A parameter's place in the global gradient norm of a model split over ranks: its squared gradient
// norm, times `weight`, is summed over `group` (null: the parameter is whole and the same on every
// rank holding it, counted once). A slice over tp counts 1, or 1/n for a slice n ranks hold alike;
// an expert slice over ep counts 1. counted false leaves it out (a copy another pipeline stage
// counts), though clipping scales it alike.
struct NormShare {
  std::shared_ptr<dist::Comm> group;
  double weight = 1.0;
  bool counted = true;
};

// The squared global norm of params' gradients (those without a grad are skipped): each grad's norm
// in fp32, squared and summed in fp64 per group, each group's sum over its ranks, then the total over
// `pipeline` (the stages) when given. Every rank of every group calls it and gets the same value.
double gradient_square(const std::vector<at::Tensor>& params, const std::vector<NormShare>& shares,
                       dist::Comm* pipeline);

// Scales every grad of `params` by max_norm / (norm + 1e-6) when max_norm > 0 and the (finite)
// norm exceeds it.
void clip_gradients_to(const std::vector<at::Tensor>& params, double norm, double max_norm);

}  // namespace loom::train
