// The one place where a model hands its transformer blocks to the wrappers that work around them
// (FSDP gathers a block's parameters just before it runs and frees them after; recompute and
// offload will re-run or move it). A model calls run_block for each block of its block lists and
// stays unaware of which wrapper, if any, is in place.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <functional>

namespace loom::nn {

class BlockRunner {
 public:
  virtual ~BlockRunner() = default;
  // Runs `forward` on `hidden` for `block` (one of the model's blocks) and returns its output.
  // `hidden` is the block's one differentiable input; everything else `forward` needs (positions,
  // masks) is captured by it.
  virtual at::Tensor run(const torch::nn::Module& block, const at::Tensor& hidden,
                         const std::function<at::Tensor(const at::Tensor&)>& forward) = 0;
};

inline at::Tensor run_block(BlockRunner* runner, const torch::nn::Module& block, const at::Tensor& hidden,
                            const std::function<at::Tensor(const at::Tensor&)>& forward) {
  return runner ? runner->run(block, hidden, forward) : forward(hidden);
}

}  // namespace loom::nn
