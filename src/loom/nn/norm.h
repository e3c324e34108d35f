// Normalisation layers with HuggingFace parameter names (weight, bias).
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "loom/parallel/tensor.h"

namespace loom::nn {

// LayerNorm over the last dimension, with affine weight and bias.
class LayerNorm : public torch::nn::Module {
 public:
  LayerNorm(int64_t dim, double eps, const parallel::ParamOptions& options);
  at::Tensor forward(const at::Tensor& x) const;  // x (..., dim) -> (..., dim)
  at::Tensor weight, bias;
  double eps;
};

// RMSNorm: x / sqrt(mean(x^2) + eps) * weight, the statistics in fp32 whatever the input dtype.
class RMSNorm : public torch::nn::Module {
 public:
  RMSNorm(int64_t dim, double eps, const parallel::ParamOptions& options);
  at::Tensor forward(const at::Tensor& x) const;  // x (..., dim) -> (..., dim)
  at::Tensor weight;
  double eps;
};

}  // namespace loom::nn
