// Normalisation layers with HuggingFace parameter names (weight, bias).
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "loom/parallel/tensor.h"

namespace loom::nn {

// The norms are whole on every rank; built with a group under sequence parallelism (options.tp),
// each rank normalises its chunk of the tokens and its gradients are partial sums over the group.

// LayerNorm over the last dimension, with affine weight and bias.
class LayerNorm : public torch::nn::Module, public parallel::Sharded {
 public:
  LayerNorm(int64_t dim, double eps, const parallel::ParamOptions& options);
  at::Tensor forward(const at::Tensor& x) const;  // x (..., dim) -> (..., dim)
  std::map<std::string, parallel::ShardLayout> layouts() const override;
  at::Tensor weight, bias;
  double eps;

 private:
  parallel::TensorParallelGroup group_;
};

// RMSNorm: x / sqrt(mean(x^2) + eps) * weight, the statistics in fp32 whatever the input dtype.
class RMSNorm : public torch::nn::Module, public parallel::Sharded {
 public:
  RMSNorm(int64_t dim, double eps, const parallel::ParamOptions& options);
  at::Tensor forward(const at::Tensor& x) const;  // x (..., dim) -> (..., dim)
  std::map<std::string, parallel::ShardLayout> layouts() const override;
  at::Tensor weight;
  double eps;

 private:
  parallel::TensorParallelGroup group_;
};

// RMSNorm over a width whose features are cut over the tensor-parallel group (Wan's q/k norms span
// every head, and the heads are split): each rank holds dim / size features of x and of the weight, and
// the mean of squares is over the whole width, the ranks' sums of squares all-reduced (their gradients
// too). With a group of one rank it is RMSNorm, the same kernel. Not for sequence parallelism.
class SplitRMSNorm : public torch::nn::Module, public parallel::Sharded {
 public:
  SplitRMSNorm(int64_t dim, double eps, const parallel::ParamOptions& options);
  at::Tensor forward(const at::Tensor& x) const;  // x (..., dim / size) -> (..., dim / size)
  std::map<std::string, parallel::ShardLayout> layouts() const override;
  at::Tensor weight;  // [dim / size]
  double eps;

 private:
  parallel::TensorParallelGroup group_;
  int64_t dim_;  // the whole width
};

}  // namespace loom::nn
