#include "loom/models/qwen2_vl/vision.h"

#include "loom/nn/activation.h"
#include "loom/nn/attention.h"
#include "loom/nn/module_list.h"
#include "loom/nn/rope.h"
#include "loom/util/errors.h"

namespace loom::models {

namespace {

constexpr double kVisionNormEps = 1e-6;
constexpr int64_t kSequenceDim = 0;  // patches are rows: (N, width)

int64_t vision_heads_per_rank(const VisionConfig& c, const parallel::ParamOptions& options) {
  return parallel::heads_per_rank(c.num_heads, options.tp.size(), "vision_tp", "the vision tower's",
                                  "attention heads");
}

std::shared_ptr<torch::nn::Module> make_norm(bool rms, int64_t dim, const parallel::ParamOptions& options) {
  if (rms) return std::make_shared<nn::RMSNorm>(dim, kVisionNormEps, options);
  return std::make_shared<nn::LayerNorm>(dim, kVisionNormEps, options);
}

at::Tensor apply_norm(bool rms, const torch::nn::Module& norm, const at::Tensor& x) {
  if (rms) return static_cast<const nn::RMSNorm&>(norm).forward(x);
  return static_cast<const nn::LayerNorm&>(norm).forward(x);
}

}  // namespace

PatchEmbed::PatchEmbed(const VisionConfig& c, const parallel::ParamOptions& options) {
  auto holder = std::make_shared<nn::WeightHolder>(
      at::IntArrayRef{c.width, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size},
      options.tensor_options());
  proj = register_module("proj", holder);
  weight = holder->weight;
}

at::Tensor PatchEmbed::forward(const at::Tensor& pixel_rows) const {
  // A stride-equals-kernel Conv3d over one patch is a matrix product with the flattened kernel.
  return at::matmul(pixel_rows.to(weight.scalar_type()), weight.flatten(1).t());
}

VisionAttention::VisionAttention(const VisionConfig& c, const parallel::ParamOptions& options)
    : num_heads(vision_heads_per_rank(c, options)) {
  // Fused [q; k; v] rows: each rank takes its heads' rows of each of the three.
  qkv = register_module(
      "qkv", std::make_shared<parallel::ColumnParallelLinear>(c.width, 3 * c.width, true, options, 3));
  proj =
      register_module("proj", std::make_shared<parallel::RowParallelLinear>(c.width, c.width, true, options));
}

at::Tensor VisionAttention::forward(const at::Tensor& x, const std::vector<int64_t>& cu_seqlens,
                                    const at::Tensor& cos, const at::Tensor& sin,
                                    const parallel::ContextAttention* context_parallel) const {
  const auto whole = qkv->group().enter(x, kSequenceDim);
  const int64_t n = whole.size(0);
  auto qkv_out = qkv->forward(whole).view({n, 3, num_heads, -1});  // (N, 3, H, D), laid out [q|k|v]
  auto q = nn::apply_rotary(qkv_out.select(1, 0), cos, sin);       // (N, H, D)
  auto k = nn::apply_rotary(qkv_out.select(1, 1), cos, sin);
  auto v = qkv_out.select(1, 2);
  auto out = context_parallel ? nn::context_attention(q, k, v, *context_parallel)
                              : nn::segment_attention(q, k, v, cu_seqlens);  // (N, H, D)
  return proj->forward(out.reshape({n, -1}), kSequenceDim);
}

VisionMlp::VisionMlp(const VisionConfig& c, const parallel::ParamOptions& options) {
  if (c.family == VisionFamily::qwen2_vl) {
    fc1 = register_module(
        "fc1", std::make_shared<parallel::ColumnParallelLinear>(c.width, c.mlp_hidden, true, options));
    fc2 = register_module(
        "fc2", std::make_shared<parallel::RowParallelLinear>(c.mlp_hidden, c.width, true, options));
  } else {
    gate_proj = register_module(
        "gate_proj", std::make_shared<parallel::ColumnParallelLinear>(c.width, c.mlp_hidden, true, options));
    up_proj = register_module(
        "up_proj", std::make_shared<parallel::ColumnParallelLinear>(c.width, c.mlp_hidden, true, options));
    down_proj = register_module(
        "down_proj", std::make_shared<parallel::RowParallelLinear>(c.mlp_hidden, c.width, true, options));
  }
}

at::Tensor VisionMlp::forward(const at::Tensor& x) const {
  if (fc1) {
    auto h = fc1->forward(fc1->group().enter(x, kSequenceDim));
    return fc2->forward(nn::quick_gelu(h), kSequenceDim);
  }
  const auto whole = gate_proj->group().enter(x, kSequenceDim);
  return down_proj->forward(nn::swiglu(gate_proj->forward(whole), up_proj->forward(whole)), kSequenceDim);
}

VisionBlock::VisionBlock(const VisionConfig& c, const parallel::ParamOptions& options)
    : rms_(c.family == VisionFamily::qwen2_5_vl) {
  norm1 = register_module("norm1", make_norm(rms_, c.width, options));
  norm2 = register_module("norm2", make_norm(rms_, c.width, options));
  attn = register_module("attn", std::make_shared<VisionAttention>(c, options));
  mlp = register_module("mlp", std::make_shared<VisionMlp>(c, options));
}

at::Tensor VisionBlock::norm(const torch::nn::Module& n, const at::Tensor& x) const {
  return apply_norm(rms_, n, x);
}

at::Tensor VisionBlock::forward(const at::Tensor& x, const std::vector<int64_t>& cu_seqlens,
                                const at::Tensor& cos, const at::Tensor& sin,
                                const parallel::ContextAttention* context_parallel) const {
  auto h = x + attn->forward(norm(*norm1, x), cu_seqlens, cos, sin, context_parallel);
  return h + mlp->forward(norm(*norm2, h));
}

PatchMerger::PatchMerger(const VisionConfig& c, const parallel::ParamOptions& options)
    : rms_(c.family == VisionFamily::qwen2_5_vl), merged_width_(c.merged_width()) {
  // The merger runs on whole sequences: sequence parallelism ends before it.
  parallel::ParamOptions whole = options;
  whole.tp.sequence_parallel = false;
  ln_q = register_module("ln_q", make_norm(rms_, c.width, whole));
  auto mlp = register_module("mlp", std::make_shared<nn::ModuleList>());
  fc_in = mlp->add(
      "0", std::make_shared<parallel::ColumnParallelLinear>(merged_width_, merged_width_, true, whole));
  fc_out =
      mlp->add("2", std::make_shared<parallel::RowParallelLinear>(merged_width_, c.out_width, true, whole));
}

at::Tensor PatchMerger::forward(const at::Tensor& x) const {
  auto h = apply_norm(rms_, *ln_q, x).reshape({-1, merged_width_});  // 4 consecutive rows = one 2x2 unit
  return fc_out->forward(at::gelu(fc_in->forward(fc_in->group().enter(h, kSequenceDim))), kSequenceDim);
}

std::vector<int64_t> vision_frame_cu_seqlens(const at::Tensor& grid_thw) {
  auto grid = grid_thw.to(at::kLong).contiguous();
  auto g = grid.accessor<int64_t, 2>();
  std::vector<int64_t> cu{0};
  for (int64_t i = 0; i < grid.size(0); ++i)
    for (int64_t t = 0; t < g[i][0]; ++t) cu.push_back(cu.back() + g[i][1] * g[i][2]);
  return cu;
}

WindowIndex vision_window_index(const at::Tensor& grid_thw, const VisionConfig& c) {
  const int64_t units_per_window =
      c.window_size / c.spatial_merge_size / c.patch_size;  // window side in units
  const int64_t unit_patches = c.spatial_merge_size * c.spatial_merge_size;
  if (units_per_window <= 0)
    throw ModelError(
        fmt::format("vision_config.window_size {} is smaller than one merge unit", c.window_size));
  auto grid = grid_thw.to(at::kLong).contiguous();
  auto g = grid.accessor<int64_t, 2>();
  std::vector<int64_t> order;
  std::vector<int64_t> cu{0};
  int64_t base = 0;
  for (int64_t i = 0; i < grid.size(0); ++i) {
    const int64_t t = g[i][0], gh = g[i][1] / c.spatial_merge_size, gw = g[i][2] / c.spatial_merge_size;
    const int64_t windows_h = (gh + units_per_window - 1) / units_per_window;
    const int64_t windows_w = (gw + units_per_window - 1) / units_per_window;
    for (int64_t frame = 0; frame < t; ++frame)
      for (int64_t wy = 0; wy < windows_h; ++wy)
        for (int64_t wx = 0; wx < windows_w; ++wx) {
          int64_t count = 0;
          for (int64_t y = wy * units_per_window; y < std::min(gh, (wy + 1) * units_per_window); ++y)
            for (int64_t x = wx * units_per_window; x < std::min(gw, (wx + 1) * units_per_window); ++x) {
              order.push_back(base + (frame * gh + y) * gw + x);
              ++count;
            }
          if (count > 0) cu.push_back(cu.back() + count * unit_patches);
        }
    base += t * gh * gw;
  }
  return {at::tensor(order, at::kLong), cu};
}

VisionTransformer::VisionTransformer(const VisionConfig& c, const parallel::ParamOptions& options)
    : config(c), tp(options.tp) {
  patch_embed = register_module("patch_embed", std::make_shared<PatchEmbed>(c, options));
  auto list = register_module("blocks", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < c.depth; ++i)
    blocks.push_back(list->append(std::make_shared<VisionBlock>(c, options)));
  merger = register_module("merger", std::make_shared<PatchMerger>(c, options));
}

}  // namespace loom::models
