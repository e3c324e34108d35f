// The Qwen2-VL / Qwen2.5-VL vision tower: patch embedding, pre-norm ViT blocks with 2-D RoPE and
// attention restricted per image frame (Qwen2.5-VL: per window, except full-attention blocks),
// and the 2x2 patch merger projecting to the LLM width.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <vector>

#include "loom/models/qwen2_vl/config.h"
#include "loom/nn/norm.h"
#include "loom/parallel/tensor.h"

namespace loom::models {

// Conv3d(C, width, k = stride = (T, P, P), no bias) applied to patch rows, stored in Conv3d layout.
class PatchEmbed : public torch::nn::Module {
 public:
  PatchEmbed(const VisionConfig& config, const parallel::ParamOptions& options);
  at::Tensor forward(const at::Tensor& pixel_rows) const;  // (N, C*T*P*P) -> (N, width)
  std::shared_ptr<torch::nn::Module> proj;                 // holds proj.weight (width, C, T, P, P)
  at::Tensor weight;
};

class VisionAttention : public torch::nn::Module {
 public:
  VisionAttention(const VisionConfig& config, const parallel::ParamOptions& options);
  // x (N, width), cos/sin (N, head_dim) -> (N, width); attending within cu_seqlens' segments, or,
  // under context parallelism (x this rank's shard of the rows), as `context_parallel` says.
  at::Tensor forward(const at::Tensor& x, const std::vector<int64_t>& cu_seqlens, const at::Tensor& cos,
                     const at::Tensor& sin,
                     const parallel::ContextAttention* context_parallel = nullptr) const;
  std::shared_ptr<parallel::ColumnParallelLinear> qkv;
  std::shared_ptr<parallel::RowParallelLinear> proj;
  int64_t num_heads;
};

// Qwen2-VL: fc1 -> QuickGELU -> fc2. Qwen2.5-VL: down(silu(gate(x)) * up(x)), with biases.
class VisionMlp : public torch::nn::Module {
 public:
  VisionMlp(const VisionConfig& config, const parallel::ParamOptions& options);
  at::Tensor forward(const at::Tensor& x) const;  // (N, width) -> (N, width)
  std::shared_ptr<parallel::ColumnParallelLinear> fc1, gate_proj, up_proj;
  std::shared_ptr<parallel::RowParallelLinear> fc2, down_proj;
};

class VisionBlock : public torch::nn::Module {
 public:
  VisionBlock(const VisionConfig& config, const parallel::ParamOptions& options);
  at::Tensor forward(const at::Tensor& x, const std::vector<int64_t>& cu_seqlens, const at::Tensor& cos,
                     const at::Tensor& sin,
                     const parallel::ContextAttention* context_parallel = nullptr) const;
  std::shared_ptr<torch::nn::Module> norm1, norm2;  // LayerNorm (Qwen2-VL) or RMSNorm (Qwen2.5-VL)
  std::shared_ptr<VisionAttention> attn;
  std::shared_ptr<VisionMlp> mlp;

 private:
  at::Tensor norm(const torch::nn::Module& n, const at::Tensor& x) const;
  bool rms_;
};

// ln_q -> view 4 rows as one -> Linear -> GELU -> Linear to the LLM width.
class PatchMerger : public torch::nn::Module {
 public:
  PatchMerger(const VisionConfig& config, const parallel::ParamOptions& options);
  at::Tensor forward(const at::Tensor& x) const;  // (N, width) -> (N/4, out_width)
  std::shared_ptr<torch::nn::Module> ln_q;
  std::shared_ptr<parallel::ColumnParallelLinear> fc_in;  // mlp.0
  std::shared_ptr<parallel::RowParallelLinear> fc_out;    // mlp.2

 private:
  bool rms_;
  int64_t merged_width_;
};

// Qwen2.5-VL windows: the permutation of merge units that groups each window's units together,
// and the cumulative patch counts per window (empty windows dropped).
struct WindowIndex {
  at::Tensor unit_order;  // (N/4) int64: new unit i is old unit unit_order[i]
  std::vector<int64_t> cu_window_seqlens;
};
WindowIndex vision_window_index(const at::Tensor& grid_thw, const VisionConfig& config);

// cu_seqlens over patches: one segment per frame of each image/video.
std::vector<int64_t> vision_frame_cu_seqlens(const at::Tensor& grid_thw);

// visual.* in HuggingFace names: patch_embed, blocks, merger. Its forward pass is the model's
// vision layers (layers.h).
class VisionTransformer : public torch::nn::Module {
 public:
  VisionTransformer(const VisionConfig& config, const parallel::ParamOptions& options);
  std::shared_ptr<PatchEmbed> patch_embed;
  std::vector<std::shared_ptr<VisionBlock>> blocks;
  std::shared_ptr<PatchMerger> merger;
  VisionConfig config;
  parallel::TensorParallelGroup
      tp;  // the tower's; with sequence_parallel, blocks see one chunk of the patches
};

}  // namespace loom::models
