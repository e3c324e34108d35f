#include "loom/models/qwen2_vl/layers.h"

#include <fmt/format.h>

#include <algorithm>

#include "loom/models/qwen2_vl/model.h"
#include "loom/models/qwen2_vl/vision.h"
#include "loom/models/text/decoder.h"
#include "loom/nn/rope.h"
#include "loom/util/errors.h"

namespace loom::models {
namespace {

constexpr double kVisionRopeTheta = 10000.0;
constexpr int64_t kPatchDim = 0;  // vision rows: (patches, width)

// Rows of x grouped by merge unit (`unit` consecutive rows each), in the order `order` gives.
at::Tensor by_unit(const at::Tensor& x, int64_t unit, const at::Tensor& order) {
  const int64_t n = x.size(0);
  return x.view({n / unit, unit, x.size(-1)}).index_select(0, order).view({n, x.size(-1)});
}

const Qwen2VLContext& qwen2vl(const core::Context& context) {
  return static_cast<const Qwen2VLContext&>(context);
}

class VisionLayer : public core::Layer {
 public:
  using core::Layer::Layer;
  std::string tower() const override { return "visual"; }
  bool active(const core::Carry&, const core::Context& context) const override {
    return qwen2vl(context).has_images();
  }
};

class PatchEmbedLayer : public VisionLayer {
 public:
  PatchEmbedLayer(std::shared_ptr<PatchEmbed> embed, const VisionTransformer& tower)
      : VisionLayer("visual.patch_embed", embed),
        embed_(std::move(embed)),
        tp_(tower.tp),
        unit_(tower.config.spatial_merge_size * tower.config.spatial_merge_size) {}

  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    const auto& c = qwen2vl(context);
    at::Tensor hidden = embed_->forward(c.pixel_values);  // (patches, width)
    if (c.unit_order.defined()) hidden = by_unit(hidden, unit_, c.unit_order);
    if (c.vision_shard.enabled()) hidden = c.vision_shard.scatter(hidden);
    carry.set("vision_hidden", parallel::scatter_sequence(tp_, kPatchDim, hidden, c.vision_chunks));
    return carry;
  }

 private:
  std::shared_ptr<PatchEmbed> embed_;
  parallel::TensorParallelGroup tp_;
  int64_t unit_;
};

class VisionBlockLayer : public VisionLayer {
 public:
  VisionBlockLayer(size_t index, std::shared_ptr<VisionBlock> block, bool full_attention)
      : VisionLayer(fmt::format("visual.blocks.{}", index), block),
        block_(std::move(block)),
        full_attention_(full_attention) {}
  bool block() const override { return true; }

  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    const auto& c = qwen2vl(context);
    // Full attention after window reordering: frames stay contiguous because windows never cross
    // frames and are emitted frame by frame.
    const auto& cu = full_attention_ ? c.frame_cu : c.window_cu;
    const parallel::ContextAttention* context_parallel = nullptr;
    if (c.vision_shard.enabled())
      context_parallel = full_attention_ ? &c.frame_attention : &c.window_attention;
    carry.set("vision_hidden",
              block_->forward(carry.get("vision_hidden"), cu, c.vision_cos, c.vision_sin, context_parallel));
    return carry;
  }

 private:
  std::shared_ptr<VisionBlock> block_;
  bool full_attention_;
};

class MergerLayer : public VisionLayer {
 public:
  MergerLayer(std::shared_ptr<PatchMerger> merger, const VisionTransformer& tower)
      : VisionLayer("visual.merger", merger), merger_(std::move(merger)), tp_(tower.tp) {}

  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    const auto& c = qwen2vl(context);
    // The merger runs on whole sequences: sequence parallelism ends before it.
    auto hidden = parallel::gather_sequence(tp_, kPatchDim, carry.take("vision_hidden"), c.vision_chunks);
    if (c.vision_shard.enabled()) hidden = c.vision_shard.gather(hidden);
    auto merged = merger_->forward(hidden);  // (patches/4, out_width)
    if (c.unit_restore.defined()) merged = merged.index_select(0, c.unit_restore);
    carry.set("image_embeds", merged);
    return carry;
  }

 private:
  std::shared_ptr<PatchMerger> merger_;
  parallel::TensorParallelGroup tp_;
};

// The rows a sequence-parallel rank's layers see: whole, or, with sequence parallelism, a multiple of tp.
int64_t aligned_to(const parallel::TensorParallelGroup& tp) { return tp.sequence_parallel ? tp.size() : 1; }

std::vector<int64_t> segment_lengths(const std::vector<int64_t>& cu) {
  std::vector<int64_t> lengths;
  for (size_t i = 0; i + 1 < cu.size(); ++i) lengths.push_back(cu[i + 1] - cu[i]);
  return lengths;
}

void add_vision_context(Qwen2VLContext& c, const VisionLanguageInputs& in, const VisionConfig& config,
                        const parallel::TensorParallelGroup& tp, const parallel::ContextParallelGroup* cp) {
  c.pixel_values = in.pixel_values;
  const int64_t n = in.pixel_values.size(0);
  auto positions = nn::vision_patch_positions(in.image_grid_thw, config.spatial_merge_size);
  if (positions.size(0) != n)
    throw ModelError(
        fmt::format("vision input has {} patch rows but image_grid_thw describes {}", n, positions.size(0)));
  auto angles = nn::vision_rope_angles(positions, config.head_dim(), kVisionRopeTheta);  // (N, D)
  c.frame_cu = vision_frame_cu_seqlens(in.image_grid_thw);
  if (config.family == VisionFamily::qwen2_5_vl) {
    // Merge units reordered so each window's patches are contiguous.
    WindowIndex windows = vision_window_index(in.image_grid_thw, config);
    c.unit_order = windows.unit_order;
    c.unit_restore = at::argsort(windows.unit_order);
    c.window_cu = std::move(windows.cu_window_seqlens);
    angles = by_unit(angles, config.spatial_merge_size * config.spatial_merge_size, c.unit_order);
  }
  c.vision_cos = angles.cos().unsqueeze(1);  // (N, 1, D)
  c.vision_sin = angles.sin().unsqueeze(1);
  int64_t rows = n;
  if (cp && cp->enabled()) {
    // Each frame's rows (in window order: windows never cross frames) split over the cp ranks.
    c.vision_shard =
        parallel::context_shard(*cp, segment_lengths(c.frame_cu), /*causal=*/false, aligned_to(tp));
    c.frame_attention = parallel::context_attention_plan(c.vision_shard, c.frame_cu);
    if (!c.window_cu.empty())
      c.window_attention = parallel::context_attention_plan(c.vision_shard, c.window_cu);
    c.vision_cos = c.vision_shard.scatter(c.vision_cos);
    c.vision_sin = c.vision_shard.scatter(c.vision_sin);
    rows = c.vision_shard.local_length;
  }
  c.vision_chunks = parallel::sequence_chunks(tp, rows);
  parallel::pad_sequence_tables(c.vision_chunks, kPatchDim, c.vision_cos, c.vision_sin,
                                {&c.frame_cu, &c.window_cu});
}

// The language model's part, with M-RoPE's tables: position ids from rope_index unless given.
void add_qwen2vl_text_context(Qwen2VLContext& c, const VisionLanguageInputs& in, const Qwen2VLConfig& config,
                              const parallel::TensorParallelGroup& tp,
                              const parallel::ContextParallelGroup* cp) {
  at::Tensor positions = in.position_ids;
  if (!positions.defined()) positions = rope_index(in, config).position_ids;
  const auto& t = config.text;
  const at::Tensor angles =
      nn::mrope_angles(positions, t.head_dim(), t.rope_theta, t.mrope_section);  // (B, L, D)
  add_text_context(c, in, angles, config.tokens.image, config.tokens.video, tp, cp);
}

// `in` with its videos' rows and grids after its images', as one stream of vision items (the tower
// runs each item's temporal patches apart, so one pass over both is the images' pass and the
// videos').
VisionLanguageInputs merged_vision(const VisionLanguageInputs& in) {
  if (!in.pixel_values_videos.defined() || in.pixel_values_videos.size(0) == 0) return in;
  VisionLanguageInputs out = in;
  const bool images = in.pixel_values.defined() && in.pixel_values.size(0) > 0;
  out.pixel_values = images ? at::cat({in.pixel_values, in.pixel_values_videos}) : in.pixel_values_videos;
  out.image_grid_thw = images ? at::cat({in.image_grid_thw, in.video_grid_thw}) : in.video_grid_thw;
  return out;
}

void move_shard(parallel::ContextShard& shard, const at::Device& device) {
  for (at::Tensor* t : {&shard.row_index, &shard.local_index, &shard.restore})
    if (t->defined()) *t = t->to(device, /*non_blocking=*/true);
}

// The tensors the layers compute with, on the weights' device (no copy when they are there).
void move_to(Qwen2VLContext& c, const at::Device& device) {
  for (at::Tensor* t : {&c.pixel_values, &c.vision_cos, &c.vision_sin, &c.unit_order, &c.unit_restore})
    if (t->defined()) *t = t->to(device, /*non_blocking=*/true);
  move_shard(c.vision_shard, device);
  move_text_context(c, device);
}

}  // namespace

std::shared_ptr<const Qwen2VLContext> qwen2vl_context(const VisionLanguageInputs& inputs,
                                                      const Qwen2VLConfig& config,
                                                      const parallel::TensorParallelGroup& vision_tp,
                                                      const parallel::TensorParallelGroup& text_tp,
                                                      const at::Device& device, KVCache* cache,
                                                      const parallel::ContextParallelGroup* cp) {
  if (cache && cp && cp->enabled())
    throw ModelError("decoding with a key/value cache runs without context parallelism");
  auto context = std::make_shared<Qwen2VLContext>();
  // Images and videos as one stream of the tower's items: the images' rows, then the videos'.
  const VisionLanguageInputs vision = merged_vision(inputs);
  if (vision.pixel_values.defined() && vision.pixel_values.size(0) > 0)
    add_vision_context(*context, vision, config.vision, vision_tp, cp);
  if (inputs.input_ids.defined()) {
    add_qwen2vl_text_context(*context, inputs, config, text_tp, cp);
    if (cache) add_cached_pass(*context, inputs, *cache);
  }
  move_to(*context, device);
  return context;
}

core::Layers qwen2vl_layers(const std::shared_ptr<VisionTransformer>& visual,
                            const std::shared_ptr<TextModel>& text, const Qwen2VLConfig& config) {
  core::Layers out;
  out.push_back(std::make_shared<PatchEmbedLayer>(visual->patch_embed, *visual));
  const auto& full = config.vision.fullatt_block_indexes;
  for (size_t i = 0; i < visual->blocks.size(); ++i) {
    const bool full_attention = config.vision.family != VisionFamily::qwen2_5_vl ||
                                std::count(full.begin(), full.end(), static_cast<int64_t>(i)) > 0;
    out.push_back(std::make_shared<VisionBlockLayer>(i, visual->blocks[i], full_attention));
  }
  out.push_back(std::make_shared<MergerLayer>(visual->merger, *visual));
  const core::Layers text_part = text_layers(text, "model.");
  out.insert(out.end(), text_part.begin(), text_part.end());
  return out;
}

}  // namespace loom::models
