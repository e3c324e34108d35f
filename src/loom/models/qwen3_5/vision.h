// Qwen3.5's vision tower with HuggingFace's names (model.visual.*), Qwen3-VL's without deepstack:
// the patch embedding (a Conv3d of kernel = stride = (2, P, P) with bias, applied to the processor's
// rows), the learned position table (num_position_embeddings, a square grid) resampled bilinearly
// (align_corners) to each image's grid, pre-norm blocks (LayerNorm, attention with 2-D rotary within
// each frame, an MLP with tanh GELU) and the merger (LayerNorm per patch, each 2 x 2 block's four
// patches concatenated, fc1, exact GELU, fc2 to the language model's width).
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <vector>

#include "loom/nn/norm.h"
#include "loom/parallel/tensor.h"

namespace loom::models::qwen3_5 {

struct VisionConfig {
  int64_t depth = 0, hidden_size = 0, intermediate_size = 0, num_heads = 0;
  int64_t in_channels = 3, patch_size = 16, spatial_merge_size = 2, temporal_patch_size = 2;
  int64_t out_hidden_size = 0, num_position_embeddings = 0;
  double rope_theta = 10000.0;
  int64_t head_dim() const { return hidden_size / num_heads; }
};

// Each patch's resampling of the learned position grid (side x side): the 4 table rows and weights
// of its bilinear interpolation (align_corners: a grid's first and last patches sit on the table's
// first and last entries), patches in the processor's order (per frame, 2 x 2 merge blocks).
// (patches, 4) int64 and (patches, 4) fp32.
std::pair<at::Tensor, at::Tensor> position_interpolation(const at::Tensor& grid_thw, int64_t side,
                                                         int64_t merge_size);

class VisionBlock : public torch::nn::Module {
 public:
  VisionBlock(const VisionConfig& config, const parallel::ParamOptions& options);
  // x (N, width), cos and sin (N, head_dim) -> (N, width), attending within cu_seqlens' segments.
  at::Tensor forward(const at::Tensor& x, const std::vector<int64_t>& cu_seqlens, const at::Tensor& cos,
                     const at::Tensor& sin) const;
  std::shared_ptr<nn::LayerNorm> norm1, norm2;
  std::shared_ptr<torch::nn::Module> attn, mlp;  // attn.qkv, attn.proj; mlp.linear_fc1, mlp.linear_fc2
  std::shared_ptr<parallel::ColumnParallelLinear> qkv, fc1;
  std::shared_ptr<parallel::RowParallelLinear> proj, fc2;
  int64_t num_heads;
};

// What the tower's layers read of a batch's grids: each frame's rows as an attention segment, the
// rows' 2-D rotary tables and their position-table interpolation.
struct VisionGeometry {
  std::vector<int64_t> cu_seqlens;
  at::Tensor cos, sin;          // (N, head_dim) fp32
  at::Tensor indices, weights;  // (N, 4): position_interpolation's
};

class VisionModel : public torch::nn::Module {
 public:
  // Tensor parallelism is not supported yet: a group of more than one rank is a ConfigError.
  VisionModel(const VisionConfig& config, const parallel::ParamOptions& options);
  // pixel_values (patches, C * T * P * P), grid_thw (items, 3) -> (patches / merge^2, out_hidden_size).
  at::Tensor forward(const at::Tensor& pixel_values, const at::Tensor& grid_thw) const;
  // The pieces of forward, as the model's layers run them.
  VisionGeometry geometry(const at::Tensor& grid_thw, const at::Device& device) const;
  at::Tensor embed(const at::Tensor& pixel_values, const VisionGeometry& geometry) const;  // -> (N, width)
  at::Tensor merge(const at::Tensor& x) const;  // (N, width) -> (N / merge^2, out_hidden_size)

  VisionConfig config;
  std::shared_ptr<torch::nn::Module> patch_embed;  // patch_embed.proj.{weight, bias}
  at::Tensor patch_weight, patch_bias;             // (width, C, T, P, P), the Conv3d's layout; (width)
  std::shared_ptr<torch::nn::Module> pos_embed;    // pos_embed.weight (num_position_embeddings, width)
  at::Tensor position_table;
  std::vector<std::shared_ptr<VisionBlock>> blocks;
  std::shared_ptr<torch::nn::Module> merger;  // merger.norm, merger.linear_fc1, merger.linear_fc2
  std::shared_ptr<nn::LayerNorm> merger_norm;
  std::shared_ptr<parallel::ColumnParallelLinear> merger_fc1;
  std::shared_ptr<parallel::RowParallelLinear> merger_fc2;
};

}  // namespace loom::models::qwen3_5
