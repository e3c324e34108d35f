#include "loom/models/wan/layers.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "loom/models/wan/dit.h"
#include "loom/util/errors.h"

namespace loom::models {

std::shared_ptr<const WanContext> wan_context(const WanConfig& config, const at::Tensor& latents,
                                              const at::Tensor& timesteps, const at::Tensor& text,
                                              const parallel::ContextParallelGroup* cp) {
  if (!latents.defined() || latents.dim() != 5 || latents.size(1) != config.in_dim)
    throw ModelError(
        fmt::format("Wan DiT: latents must be [B, {}, T, H, W], got [{}]", config.in_dim,
                    latents.defined() ? fmt::format("{}", fmt::join(latents.sizes(), ", ")) : ""));
  const int64_t batch = latents.size(0);
  if (!timesteps.defined() || timesteps.dim() != 1 || timesteps.size(0) != batch)
    throw ModelError(
        fmt::format("Wan DiT: timesteps must be [{}], got [{}]", batch,
                    timesteps.defined() ? fmt::format("{}", fmt::join(timesteps.sizes(), ", ")) : ""));
  if (!text.defined() || text.dim() != 3 || text.size(0) != batch || text.size(2) != config.text_dim ||
      text.size(1) > config.text_len)
    throw ModelError(fmt::format("Wan DiT: text must be [{}, at most {}, {}], got [{}]", batch,
                                 config.text_len, config.text_dim,
                                 text.defined() ? fmt::format("{}", fmt::join(text.sizes(), ", ")) : ""));
  auto context = std::make_shared<WanContext>();
  context->latents = latents;
  context->timesteps = timesteps.to(at::kDouble);
  // Wan pads every prompt with zero rows to text_len; the cross-attention sees all of them.
  context->text = text.size(1) == config.text_len
                      ? text
                      : at::constant_pad_nd(text, {0, 0, 0, config.text_len - text.size(1)}, 0.0);
  context->grid = latent_grid(latents, config.patch_size);
  const auto [cos, sin] = wan_rope_tables(wan_grid_positions(context->grid), config.head_dim(), 10000.0,
                                          config.rope_max_positions);
  context->rope_cos = cos.to(latents.device());
  context->rope_sin = sin.to(latents.device());
  const int64_t length = context->grid.tokens();
  for (int64_t b = 0; b <= batch; ++b) context->self_cu.push_back(b * length);
  if (cp && cp->enabled()) {
    context->shard = parallel::context_row_shard(*cp, batch, length, /*causal=*/false);
    context->self_attention = parallel::context_attention_plan(context->shard, context->self_cu);
    const at::Tensor positions = context->shard.row_index.to(latents.device());
    auto held = [&positions](const at::Tensor& table) {  // (L, 1, d/2) -> this rank's positions, padding 0
      return at::cat({table, at::zeros_like(table.narrow(0, 0, 1))}).index_select(0, positions);
    };
    context->rope_cos = held(context->rope_cos);
    context->rope_sin = held(context->rope_sin);
  }
  return context;
}

at::Tensor pad_text(const std::vector<at::Tensor>& prompts, int64_t text_len) {
  if (prompts.empty()) throw ModelError("Wan DiT: no prompts to pad");
  std::vector<at::Tensor> rows;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const at::Tensor& p = prompts[i];
    if (p.dim() != 2 || p.size(0) > text_len || p.size(1) != prompts[0].size(1))
      throw ModelError(fmt::format("Wan DiT: prompt {} has text features [{}]; expected [at most {}, {}]", i,
                                   fmt::join(p.sizes(), ", "), text_len, prompts[0].size(-1)));
    rows.push_back(at::constant_pad_nd(p, {0, 0, 0, text_len - p.size(0)}, 0.0));
  }
  return at::stack(rows);  // [B, text_len, text_dim]
}

namespace {

const WanContext& wan(const core::Context& context) { return static_cast<const WanContext&>(context); }

// Every layer of the DiT is in its one tower (model.pipeline_layers: {dit: [...]}).
class WanLayer : public core::Layer {
 public:
  using core::Layer::Layer;
  std::string tower() const override { return "dit"; }
};

class TimeEmbeddingLayer : public WanLayer {
 public:
  TimeEmbeddingLayer(const std::shared_ptr<WanTimeEmbedding>& module, int64_t freq_dim)
      : WanLayer("time_embedding", module), module_(module), freq_dim_(freq_dim) {}
  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    carry.set("time_embedding", module_->forward(wan_sinusoid(freq_dim_, wan(context).timesteps)));  // [B, C]
    return carry;
  }

 private:
  std::shared_ptr<WanTimeEmbedding> module_;
  int64_t freq_dim_;
};

class TimeProjectionLayer : public WanLayer {
 public:
  explicit TimeProjectionLayer(const std::shared_ptr<WanTimeProjection>& module)
      : WanLayer("time_projection", module), module_(module) {}
  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    (void)context;
    carry.set("time_modulation", module_->forward(carry.get("time_embedding")));  // [B, 6, C]
    return carry;
  }

 private:
  std::shared_ptr<WanTimeProjection> module_;
};

class TextEmbeddingLayer : public WanLayer {
 public:
  explicit TextEmbeddingLayer(const std::shared_ptr<WanTextEmbedding>& module)
      : WanLayer("text_embedding", module), module_(module) {}
  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    carry.set("context", module_->forward(wan(context).text));  // [B, text_len, C]
    return carry;
  }

 private:
  std::shared_ptr<WanTextEmbedding> module_;
};

class PatchEmbeddingLayer : public WanLayer {
 public:
  explicit PatchEmbeddingLayer(const std::shared_ptr<WanPatchEmbedding>& module)
      : WanLayer("patch_embedding", module), module_(module) {}
  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    const WanContext& c = wan(context);
    const at::Tensor hidden = module_->forward(c.latents).to(at::kFloat);  // [B, L, C]
    carry.set("hidden", c.shard.enabled() ? c.shard.scatter_rows(hidden) : hidden);
    return carry;
  }

 private:
  std::shared_ptr<WanPatchEmbedding> module_;
};

class BlockLayer : public WanLayer {
 public:
  BlockLayer(size_t index, const std::shared_ptr<WanAttentionBlock>& block)
      : WanLayer(fmt::format("blocks.{}", index), block), block_(block) {}
  bool block() const override { return true; }
  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    const WanContext& c = wan(context);
    carry.set("hidden", block_->forward(carry.take("hidden"), carry.get("time_modulation"),
                                        carry.get("context"), c.rope_cos, c.rope_sin, c.self_cu,
                                        c.shard.enabled() ? &c.self_attention : nullptr));
    return carry;
  }

 private:
  std::shared_ptr<WanAttentionBlock> block_;
};

class HeadLayer : public WanLayer {
 public:
  explicit HeadLayer(const std::shared_ptr<WanHead>& head) : WanLayer("head", head), head_(head) {}
  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    (void)context;
    const at::Tensor e = carry.take("time_embedding");
    carry.take("time_modulation");
    carry.take("context");
    carry.set("hidden", head_->forward(carry.take("hidden"), e));  // [B, L, pt ph pw C_out]
    return carry;
  }

 private:
  std::shared_ptr<WanHead> head_;
};

}  // namespace

core::Layers wan_layers(const WanModel& model) {
  core::Layers layers;
  layers.push_back(std::make_shared<TimeEmbeddingLayer>(model.time_embedding, model.config.freq_dim));
  layers.push_back(std::make_shared<TimeProjectionLayer>(model.time_projection));
  layers.push_back(std::make_shared<TextEmbeddingLayer>(model.text_embedding));
  layers.push_back(std::make_shared<PatchEmbeddingLayer>(model.patch_embedding));
  for (size_t i = 0; i < model.blocks.size(); ++i)
    layers.push_back(std::make_shared<BlockLayer>(i, model.blocks[i]));
  layers.push_back(std::make_shared<HeadLayer>(model.head));
  return layers;
}

}  // namespace loom::models
