#include "loom/models/qwen3_5/vision.h"

#include <fmt/format.h>

#include <cmath>

#include "loom/nn/attention.h"
#include "loom/nn/module_list.h"
#include "loom/nn/rope.h"
#include "loom/util/errors.h"

namespace loom::models::qwen3_5 {
namespace {

// A Conv3d's weight and bias under one name (patch_embed.proj).
class ConvHolder : public torch::nn::Module {
 public:
  ConvHolder(at::IntArrayRef shape, const at::TensorOptions& options) {
    weight = register_parameter("weight", at::empty(shape, options));
    bias = register_parameter("bias", at::empty({shape[0]}, options));
  }
  at::Tensor weight, bias;
};

// One axis's two interpolation taps and weights for index i of a grid axis of `size` patches over a
// table axis of `side` entries, in fp32 as transformers computes them.
void axis_taps(int64_t i, int64_t size, int64_t side, int64_t taps[2], float weights[2]) {
  const float src = static_cast<float>(i) * static_cast<float>(side - 1) /
                    static_cast<float>(std::max<int64_t>(size - 1, 1));
  const float floor = std::floor(src);
  for (int o = 0; o < 2; ++o) {
    taps[o] = std::clamp<int64_t>(static_cast<int64_t>(floor) + o, 0, side - 1);
    weights[o] = std::max(1.0f - std::fabs(src - floor - static_cast<float>(o)), 0.0f);
  }
}

}  // namespace

std::pair<at::Tensor, at::Tensor> position_interpolation(const at::Tensor& grid_thw, int64_t side,
                                                         int64_t merge) {
  const at::Tensor grid = grid_thw.to(at::kLong).cpu().contiguous();
  std::vector<int64_t> indices;
  std::vector<float> weights;
  for (int64_t item = 0; item < grid.size(0); ++item) {
    const int64_t t = grid[item][0].item<int64_t>(), h = grid[item][1].item<int64_t>(),
                  w = grid[item][2].item<int64_t>();
    for (int64_t frame = 0; frame < t; ++frame)
      for (int64_t within = 0; within < h * w; ++within) {
        // The processor's order: 2 x 2 merge blocks row by row, each block's patches row by row.
        const int64_t in_col = within % merge, in_row = (within / merge) % merge;
        const int64_t block_col = (within / (merge * merge)) % (w / merge),
                      block_row = within / (merge * merge * (w / merge));
        int64_t rows[2], cols[2];
        float row_weights[2], col_weights[2];
        axis_taps(block_row * merge + in_row, h, side, rows, row_weights);
        axis_taps(block_col * merge + in_col, w, side, cols, col_weights);
        for (int a = 0; a < 2; ++a)
          for (int b = 0; b < 2; ++b) {
            indices.push_back(rows[a] * side + cols[b]);
            weights.push_back(row_weights[a] * col_weights[b]);
          }
      }
  }
  const auto n = static_cast<int64_t>(indices.size()) / 4;
  return {at::tensor(indices, at::kLong).view({n, 4}), at::tensor(weights, at::kFloat).view({n, 4})};
}

VisionBlock::VisionBlock(const VisionConfig& c, const parallel::ParamOptions& options)
    : num_heads(c.num_heads) {
  norm1 = register_module("norm1", std::make_shared<nn::LayerNorm>(c.hidden_size, 1e-6, options));
  norm2 = register_module("norm2", std::make_shared<nn::LayerNorm>(c.hidden_size, 1e-6, options));
  attn = register_module("attn", std::make_shared<torch::nn::Module>());
  qkv = attn->register_module("qkv", std::make_shared<parallel::ColumnParallelLinear>(
                                         c.hidden_size, 3 * c.hidden_size, true, options, 3));
  proj = attn->register_module(
      "proj", std::make_shared<parallel::RowParallelLinear>(c.hidden_size, c.hidden_size, true, options));
  mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
  fc1 = mlp->register_module("linear_fc1", std::make_shared<parallel::ColumnParallelLinear>(
                                               c.hidden_size, c.intermediate_size, true, options));
  fc2 = mlp->register_module("linear_fc2", std::make_shared<parallel::RowParallelLinear>(
                                               c.intermediate_size, c.hidden_size, true, options));
}

at::Tensor VisionBlock::forward(const at::Tensor& x, const std::vector<int64_t>& cu_seqlens,
                                const at::Tensor& cos, const at::Tensor& sin) const {
  const int64_t n = x.size(0);
  const at::Tensor qkv_rows = qkv->forward(norm1->forward(x)).view({n, 3, num_heads, -1});
  const at::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);  // (N, 1, head_dim)
  const at::Tensor q = nn::apply_rotary(qkv_rows.select(1, 0), c, s);
  const at::Tensor k = nn::apply_rotary(qkv_rows.select(1, 1), c, s);
  const at::Tensor attended =
      nn::segment_attention(q, k, qkv_rows.select(1, 2), cu_seqlens, /*causal=*/false);
  const at::Tensor h = x + proj->forward(attended.reshape({n, -1}), 0);
  return h + fc2->forward(at::gelu(fc1->forward(norm2->forward(h)), "tanh"), 0);
}

VisionModel::VisionModel(const VisionConfig& c, const parallel::ParamOptions& options) : config(c) {
  if (options.tp.size() > 1)
    throw ConfigError(
        fmt::format("parallel.tp={}: Qwen3.5's vision tower does not split over tensor-parallel "
                    "ranks yet",
                    options.tp.size()));
  const auto side =
      static_cast<int64_t>(std::lround(std::sqrt(static_cast<double>(c.num_position_embeddings))));
  if (side * side != c.num_position_embeddings)
    throw ConfigError(fmt::format("vision_config.num_position_embeddings {} is not a square grid",
                                  c.num_position_embeddings));
  const auto tensors = options.tensor_options();
  patch_embed = register_module("patch_embed", std::make_shared<torch::nn::Module>());
  auto conv = patch_embed->register_module(
      "proj", std::make_shared<ConvHolder>(at::IntArrayRef{c.hidden_size, c.in_channels,
                                                           c.temporal_patch_size, c.patch_size, c.patch_size},
                                           tensors));
  patch_weight = conv->weight;
  patch_bias = conv->bias;
  auto table =
      std::make_shared<nn::WeightHolder>(at::IntArrayRef{c.num_position_embeddings, c.hidden_size}, tensors);
  position_table = table->weight;
  pos_embed = register_module("pos_embed", table);
  auto list = register_module("blocks", std::make_shared<nn::ModuleList>());
  for (int64_t b = 0; b < c.depth; ++b)
    blocks.push_back(list->append(std::make_shared<VisionBlock>(c, options)));
  const int64_t merged = c.hidden_size * c.spatial_merge_size * c.spatial_merge_size;
  merger = register_module("merger", std::make_shared<torch::nn::Module>());
  merger_norm =
      merger->register_module("norm", std::make_shared<nn::LayerNorm>(c.hidden_size, 1e-6, options));
  merger_fc1 = merger->register_module(
      "linear_fc1", std::make_shared<parallel::ColumnParallelLinear>(merged, merged, true, options));
  merger_fc2 = merger->register_module(
      "linear_fc2", std::make_shared<parallel::RowParallelLinear>(merged, c.out_hidden_size, true, options));
}

VisionGeometry VisionModel::geometry(const at::Tensor& grid_thw, const at::Device& device) const {
  const VisionConfig& c = config;
  const int64_t side =
      static_cast<int64_t>(std::lround(std::sqrt(static_cast<double>(c.num_position_embeddings))));
  VisionGeometry g;
  std::tie(g.indices, g.weights) = position_interpolation(grid_thw, side, c.spatial_merge_size);
  g.indices = g.indices.to(device);
  g.weights = g.weights.to(device);
  const at::Tensor angles =
      nn::vision_rope_angles(nn::vision_patch_positions(grid_thw.cpu(), c.spatial_merge_size).to(device),
                             c.head_dim(), c.rope_theta);
  g.cos = angles.cos();
  g.sin = angles.sin();
  // Attention within each frame: every temporal patch of an item is a segment of h * w rows.
  g.cu_seqlens = {0};
  const at::Tensor grid = grid_thw.to(at::kLong).cpu();
  for (int64_t i = 0; i < grid.size(0); ++i)
    for (int64_t t = 0; t < grid[i][0].item<int64_t>(); ++t)
      g.cu_seqlens.push_back(g.cu_seqlens.back() + grid[i][1].item<int64_t>() * grid[i][2].item<int64_t>());
  return g;
}

at::Tensor VisionModel::embed(const at::Tensor& pixel_values, const VisionGeometry& g) const {
  const VisionConfig& c = config;
  // The Conv3d with kernel = stride is a product with its flattened weight.
  const at::Tensor x = at::addmm(patch_bias, pixel_values.to(patch_weight.scalar_type()),
                                 patch_weight.reshape({c.hidden_size, -1}).t());
  const at::Tensor positions =
      (position_table.index_select(0, g.indices.flatten()).view({g.indices.size(0), 4, c.hidden_size}) *
       g.weights.unsqueeze(-1))
          .sum(1);
  return x + positions.to(x.scalar_type());
}

at::Tensor VisionModel::merge(const at::Tensor& x) const {
  const int64_t merged = config.hidden_size * config.spatial_merge_size * config.spatial_merge_size;
  const at::Tensor rows = merger_norm->forward(x).view({-1, merged});
  return merger_fc2->forward(at::gelu(merger_fc1->forward(rows)), 0);
}

at::Tensor VisionModel::forward(const at::Tensor& pixel_values, const at::Tensor& grid_thw) const {
  const VisionGeometry g = geometry(grid_thw, pixel_values.device());
  at::Tensor x = embed(pixel_values, g);
  for (const auto& block : blocks) x = block->forward(x, g.cu_seqlens, g.cos, g.sin);
  return merge(x);
}

}  // namespace loom::models::qwen3_5
