// Tensor-parallel layers (Megatron style). A model builds these where a layer will be split
// across a tensor-parallel group; with a group of size 1 they are plain linears/embeddings.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

namespace loom::parallel {

// How the parameters a layer holds are created: real CPU storage, or shapes only (meta device).
struct ParamOptions {
  at::ScalarType dtype = at::kFloat;
  bool shapes_only = false;
  at::TensorOptions tensor_options() const;
};

// The tensor-parallel group a layer is split over. Only size 1 runs in this version of Loom;
// larger groups are refused at construction with a clear error.
struct TensorParallelGroup {
  int64_t size = 1;
  int64_t rank = 0;
};

// y = x W^T + b with W (out, in) split along `out` over the group: each rank holds out/size rows.
class ColumnParallelLinear : public torch::nn::Module {
 public:
  ColumnParallelLinear(int64_t in_features, int64_t out_features, bool bias, const ParamOptions& options,
                       TensorParallelGroup group = {});
  at::Tensor forward(const at::Tensor& x) const;  // x (..., in) -> (..., out/size)
  at::Tensor weight, bias;

 private:
  TensorParallelGroup group_;
};

// y = x W^T + b with W (out, in) split along `in`: each rank holds in/size columns; the partial
// products are summed over the group.
class RowParallelLinear : public torch::nn::Module {
 public:
  RowParallelLinear(int64_t in_features, int64_t out_features, bool bias, const ParamOptions& options,
                    TensorParallelGroup group = {});
  at::Tensor forward(const at::Tensor& x) const;  // x (..., in/size) -> (..., out)
  at::Tensor weight, bias;

 private:
  TensorParallelGroup group_;
};

// Token embedding with the vocabulary split over the group.
class VocabParallelEmbedding : public torch::nn::Module {
 public:
  VocabParallelEmbedding(int64_t vocab_size, int64_t dim, const ParamOptions& options,
                         TensorParallelGroup group = {});
  at::Tensor forward(const at::Tensor& ids) const;  // ids (...) int64 -> (..., dim)
  at::Tensor weight;

 private:
  TensorParallelGroup group_;
};

}  // namespace loom::parallel
