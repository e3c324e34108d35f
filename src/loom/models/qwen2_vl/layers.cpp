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
constexpr int64_t kTokenDim = 1;  // text rows: (B, L, hidden)

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

class TextLayer : public core::Layer {
 public:
  using core::Layer::Layer;
  std::string tower() const override { return "llm"; }
  bool active(const core::Carry&, const core::Context& context) const override {
    return qwen2vl(context).has_text();
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

class EmbedLayer : public TextLayer {
 public:
  EmbedLayer(std::shared_ptr<parallel::VocabParallelEmbedding> embed, const TextModel& text)
      : TextLayer("model.embed_tokens", embed),
        embed_(std::move(embed)),
        tp_(text.tp),
        tied_(text.config.tie_word_embeddings) {}
  bool parameters_read_outside() const override { return tied_; }

  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    const auto& c = qwen2vl(context);
    auto embeds = embed_->forward(c.input_ids);  // (B, L, hidden)
    if (carry.has("image_embeds")) {
      auto image_embeds = carry.take("image_embeds").to(embeds.scalar_type());
      if (c.image_tokens != image_embeds.size(0))
        throw ModelError(fmt::format("the input ids hold {} image tokens but the images give {} embeddings",
                                     c.image_tokens, image_embeds.size(0)));
      embeds = embeds.masked_scatter(c.image_mask, image_embeds);
    }
    if (c.text_shard.enabled()) embeds = c.text_shard.scatter(embeds.flatten(0, 1)).unsqueeze(0);
    carry.set("hidden", parallel::scatter_sequence(tp_, kTokenDim, embeds, c.text_chunks));
    return carry;
  }

 private:
  std::shared_ptr<parallel::VocabParallelEmbedding> embed_;
  parallel::TensorParallelGroup tp_;
  bool tied_;
};

class DecoderBlockLayer : public TextLayer {
 public:
  DecoderBlockLayer(size_t index, std::shared_ptr<DecoderLayer> block)
      : TextLayer(fmt::format("model.layers.{}", index), block), block_(std::move(block)), index_(index) {}
  bool block() const override { return true; }

  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    const auto& c = qwen2vl(context);
    const CachedPass* cached = c.cached.cache ? &c.cached : nullptr;
    const parallel::ContextAttention* context_parallel = c.text_shard.enabled() ? &c.text_attention : nullptr;
    carry.set("hidden", block_->forward(carry.get("hidden"), c.cos, c.sin, c.cu_seqlens, cached, index_,
                                        context_parallel));
    return carry;
  }

 private:
  std::shared_ptr<DecoderLayer> block_;
  size_t index_;
};

class FinalNormLayer : public TextLayer {
 public:
  FinalNormLayer(std::shared_ptr<nn::RMSNorm> norm, const TextModel& text)
      : TextLayer("model.norm", norm), norm_(std::move(norm)), tp_(text.tp) {}

  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    const auto& c = qwen2vl(context);
    // The final norm runs on whole sequences: sequence parallelism ends before it, and the
    // padding is cut off (context parallelism's shard stays: the loss is taken on it).
    carry.set("hidden",
              norm_->forward(parallel::gather_sequence(tp_, kTokenDim, carry.take("hidden"), c.text_chunks)));
    return carry;
  }

 private:
  std::shared_ptr<nn::RMSNorm> norm_;
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

void add_text_context(Qwen2VLContext& c, const VisionLanguageInputs& in, const Qwen2VLConfig& config,
                      const parallel::TensorParallelGroup& tp, const parallel::ContextParallelGroup* cp) {
  c.input_ids = in.input_ids;
  const auto is_image = in.input_ids == config.tokens.image;
  c.image_mask = is_image.unsqueeze(-1);
  c.image_tokens = is_image.sum().item<int64_t>();
  at::Tensor positions = in.position_ids;
  if (!positions.defined())
    positions =
        rope_index(in.input_ids, in.image_grid_thw, in.attention_mask, config, in.cu_seqlens).position_ids;
  const auto& t = config.text;
  auto angles = nn::mrope_angles(positions, t.head_dim(), t.rope_theta, t.mrope_section);  // (B, L, D)
  c.cos = angles.cos().unsqueeze(2);                                                       // (B, L, 1, D)
  c.sin = angles.sin().unsqueeze(2);
  c.cu_seqlens = in.cu_seqlens;
  int64_t tokens = in.input_ids.size(kTokenDim);
  if (cp && cp->enabled()) {
    // Every packed sample (or row) causal on its own, its tokens split over the cp ranks.
    std::vector<int64_t> cu = in.cu_seqlens;
    if (cu.empty())
      for (int64_t row = 0; row <= in.input_ids.size(0); ++row) cu.push_back(row * tokens);
    c.text_shard = parallel::context_shard(*cp, segment_lengths(cu), /*causal=*/true, aligned_to(tp));
    c.text_attention = parallel::context_attention_plan(c.text_shard, cu);
    c.cos = c.text_shard.scatter(c.cos.flatten(0, 1)).unsqueeze(0);  // (1, local tokens, 1, D)
    c.sin = c.text_shard.scatter(c.sin.flatten(0, 1)).unsqueeze(0);
    tokens = c.text_shard.local_length;
  }
  // Sequence parallelism: the padding of a length tp does not divide is a segment of its own
  // (packed rows) or after every real token (causal rows).
  c.text_chunks = parallel::sequence_chunks(tp, tokens);
  parallel::pad_sequence_tables(c.text_chunks, kTokenDim, c.cos, c.sin, {&c.cu_seqlens});
}

// Decoding: the new tokens' mask joins the cache's, and each new token (sequence-parallel padding
// included, which sees every real token) is allowed the real tokens up to itself, and itself.
void add_cached_pass(Qwen2VLContext& c, const VisionLanguageInputs& in, KVCache& cache) {
  if (!in.cu_seqlens.empty())
    throw ModelError("decoding with a key/value cache takes one sample per row, not packed rows");
  const int64_t rows = in.input_ids.size(0), length = in.input_ids.size(kTokenDim), past = cache.length();
  if (past > 0 && cache.valid.size(0) != rows)
    throw ModelError(
        fmt::format("the key/value cache holds {} rows, the input {}", cache.valid.size(0), rows));
  const at::Tensor real =
      in.attention_mask.defined() ? in.attention_mask.to(at::kBool) : at::ones({rows, length}, at::kBool);
  const at::Tensor valid = past > 0 ? at::cat({cache.valid, real}, 1) : real;  // (B, past + length)
  const int64_t padded = c.text_chunks.split ? c.text_chunks.padded : length;
  auto query = at::arange(past, past + padded, at::kLong).view({padded, 1});
  auto key = at::arange(past + length, at::kLong).view({1, past + length});
  c.cached.allowed = (valid.unsqueeze(1) & key.le(query).unsqueeze(0)) | key.eq(query).unsqueeze(0);
  c.cached.appended = length;
  c.cached.cache = &cache;
  cache.valid = valid;
}

void move_shard(parallel::ContextShard& shard, const at::Device& device) {
  for (at::Tensor* t : {&shard.row_index, &shard.local_index, &shard.restore})
    if (t->defined()) *t = t->to(device, /*non_blocking=*/true);
}

// The tensors the layers compute with, on the weights' device (no copy when they are there).
void move_to(Qwen2VLContext& c, const at::Device& device) {
  for (at::Tensor* t : {&c.pixel_values, &c.vision_cos, &c.vision_sin, &c.unit_order, &c.unit_restore,
                        &c.input_ids, &c.image_mask, &c.cos, &c.sin, &c.cached.allowed})
    if (t->defined()) *t = t->to(device, /*non_blocking=*/true);
  move_shard(c.vision_shard, device);
  move_shard(c.text_shard, device);
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
  if (inputs.pixel_values.defined() && inputs.pixel_values.size(0) > 0)
    add_vision_context(*context, inputs, config.vision, vision_tp, cp);
  if (inputs.input_ids.defined()) {
    add_text_context(*context, inputs, config, text_tp, cp);
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
  out.push_back(std::make_shared<EmbedLayer>(text->embed_tokens, *text));
  for (size_t i = 0; i < text->layers.size(); ++i)
    out.push_back(std::make_shared<DecoderBlockLayer>(i, text->layers[i]));
  out.push_back(std::make_shared<FinalNormLayer>(text->norm, *text));
  return out;
}

}  // namespace loom::models
