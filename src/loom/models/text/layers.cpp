#include "loom/models/text/layers.h"

#include <fmt/format.h>

#include "loom/util/errors.h"

namespace loom::models {
namespace {

constexpr int64_t kTokenDim = 1;  // text rows: (B, L, hidden)

const TextContext& text_context(const core::Context& context) {
  return static_cast<const TextContext&>(context);
}

class TextLayer : public core::Layer {
 public:
  using core::Layer::Layer;
  std::string tower() const override { return "llm"; }
  bool active(const core::Carry&, const core::Context& context) const override {
    return text_context(context).has_text();
  }
};

class EmbedLayer : public TextLayer {
 public:
  EmbedLayer(const std::string& name, std::shared_ptr<parallel::VocabParallelEmbedding> embed,
             const TextModel& text)
      : TextLayer(name, embed),
        embed_(std::move(embed)),
        tp_(text.tp),
        tied_(text.config.tie_word_embeddings) {}
  bool parameters_read_outside() const override { return tied_; }

  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    const auto& c = text_context(context);
    auto embeds = embed_->forward(c.input_ids);  // (B, L, hidden)
    if (carry.has("image_embeds")) {
      // The images' rows, then the videos'.
      auto image_embeds = carry.take("image_embeds").to(embeds.scalar_type());
      if (c.image_tokens + c.video_tokens != image_embeds.size(0))
        throw ModelError(
            fmt::format("the input ids hold {} image and {} video tokens but the vision tower gives {} "
                        "embeddings",
                        c.image_tokens, c.video_tokens, image_embeds.size(0)));
      if (c.image_tokens > 0)
        embeds = embeds.masked_scatter(c.image_mask, image_embeds.narrow(0, 0, c.image_tokens));
      if (c.video_tokens > 0)
        embeds = embeds.masked_scatter(c.video_mask, image_embeds.narrow(0, c.image_tokens, c.video_tokens));
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
  DecoderBlockLayer(const std::string& name, size_t index, std::shared_ptr<DecoderLayer> block)
      : TextLayer(name, block), block_(std::move(block)), index_(index) {}
  bool block() const override { return true; }

  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    const auto& c = text_context(context);
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
  FinalNormLayer(const std::string& name, std::shared_ptr<nn::RMSNorm> norm, const TextModel& text)
      : TextLayer(name, norm), norm_(std::move(norm)), tp_(text.tp) {}

  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    const auto& c = text_context(context);
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

void move_shard(parallel::ContextShard& shard, const at::Device& device) {
  for (at::Tensor* t : {&shard.row_index, &shard.local_index, &shard.restore})
    if (t->defined()) *t = t->to(device, /*non_blocking=*/true);
}

}  // namespace

void add_text_context(TextContext& c, const VisionLanguageInputs& in, const at::Tensor& angles,
                      int64_t image_token, int64_t video_token, const parallel::TensorParallelGroup& tp,
                      const parallel::ContextParallelGroup* cp) {
  c.input_ids = in.input_ids;
  const auto is_image = in.input_ids == image_token;
  c.image_mask = is_image.unsqueeze(-1);
  c.image_tokens = is_image.sum().item<int64_t>();
  if (video_token >= 0) {
    const auto is_video = in.input_ids == video_token;
    c.video_tokens = is_video.sum().item<int64_t>();
    if (c.video_tokens > 0) c.video_mask = is_video.unsqueeze(-1);
  }
  c.cos = angles.cos().unsqueeze(2);  // (B, L, 1, D)
  c.sin = angles.sin().unsqueeze(2);
  c.cu_seqlens = in.cu_seqlens;
  int64_t tokens = in.input_ids.size(kTokenDim);
  if (cp && cp->enabled()) {
    // Every packed sample (or row) causal on its own, its tokens split over the cp ranks.
    std::vector<int64_t> cu = in.cu_seqlens;
    if (cu.empty())
      for (int64_t row = 0; row <= in.input_ids.size(0); ++row) cu.push_back(row * tokens);
    std::vector<int64_t> lengths;
    for (size_t i = 0; i + 1 < cu.size(); ++i) lengths.push_back(cu[i + 1] - cu[i]);
    c.text_shard =
        parallel::context_shard(*cp, lengths, /*causal=*/true, tp.sequence_parallel ? tp.size() : 1);
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

void add_cached_pass(TextContext& c, const VisionLanguageInputs& in, KVCache& cache) {
  if (!in.cu_seqlens.empty())
    throw ModelError("decoding with a key/value cache takes one sample per row, not packed rows");
  const int64_t rows = in.input_ids.size(0), length = in.input_ids.size(kTokenDim), past = cache.length();
  if (past > 0 && cache.valid.size(0) != rows)
    throw ModelError(
        fmt::format("the key/value cache holds {} rows, the input {}", cache.valid.size(0), rows));
  const at::Tensor real =
      in.attention_mask.defined() ? in.attention_mask.to(at::kBool) : at::ones({rows, length}, at::kBool);
  const at::Tensor valid = past > 0 ? at::cat({cache.valid, real}, 1) : real;  // (B, past + length)
  // Sequence-parallel padding sees every real token.
  const int64_t padded = c.text_chunks.split ? c.text_chunks.padded : length;
  auto query = at::arange(past, past + padded, at::kLong).view({padded, 1});
  auto key = at::arange(past + length, at::kLong).view({1, past + length});
  c.cached.allowed = (valid.unsqueeze(1) & key.le(query).unsqueeze(0)) | key.eq(query).unsqueeze(0);
  c.cached.appended = length;
  c.cached.cache = &cache;
  cache.valid = valid;
}

void move_text_context(TextContext& c, const at::Device& device) {
  for (at::Tensor* t : {&c.input_ids, &c.image_mask, &c.video_mask, &c.cos, &c.sin, &c.cached.allowed})
    if (t->defined()) *t = t->to(device, /*non_blocking=*/true);
  move_shard(c.text_shard, device);
}

core::Layers text_layers(const std::shared_ptr<TextModel>& text, const std::string& prefix) {
  core::Layers out;
  out.push_back(std::make_shared<EmbedLayer>(prefix + "embed_tokens", text->embed_tokens, *text));
  for (size_t i = 0; i < text->layers.size(); ++i)
    out.push_back(
        std::make_shared<DecoderBlockLayer>(fmt::format("{}layers.{}", prefix, i), i, text->layers[i]));
  out.push_back(std::make_shared<FinalNormLayer>(prefix + "norm", text->norm, *text));
  return out;
}

}  // namespace loom::models
