// Learning-rate schedule (linear warmup, then cosine decay) and global gradient-norm clipping.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
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

// The same for a model split by tensor parallelism over `group`: share[i] > 0 says each rank holds
// a slice of params[i], whose squared norm, times share[i], is summed over the group (1, or 1/n
// for a slice n ranks hold alike); share 0 is a whole parameter, the same on every rank (counted
// once). Every rank of the group calls it and gets the same norm.
double clip_grad_norm(const std::vector<at::Tensor>& params, const std::vector<double>& share,
                      dist::Comm& group, double max_norm);

// The same for parameters split over either of two groups (tensor-parallel slices over `group`,
// experts over `second`): second_share[i] > 0 counts params[i]'s squares in the sum over `second`;
// a parameter with both shares 0 is whole (counted once).
double clip_grad_norm(const std::vector<at::Tensor>& params, const std::vector<double>& share,
                      dist::Comm& group, const std::vector<double>& second_share, dist::Comm& second,
                      double max_norm);

// The same over a pipeline: each rank's sum (as above, over `tensor_parallel` when given) is
// summed over the `pipeline` group; counted[i] false leaves params[i] out of the sum (a copy another
// stage counts: a tied embedding) but scales it alike.
double clip_grad_norm(const std::vector<at::Tensor>& params, const std::vector<double>& share,
                      const std::vector<bool>& counted, dist::Comm* tensor_parallel, dist::Comm& pipeline,
                      double max_norm);

}  // namespace loom::train
