#include "loom/models/qwen3_5/model.h"

#include <fmt/format.h>

#include <optional>

#include "loom/checkpoint/hf_export.h"
#include "loom/dist/mappings.h"
#include "loom/nn/fused.h"
#include "loom/util/errors.h"

namespace loom::models::qwen3_5 {
namespace {

const Context& qwen35(const core::Context& context) { return static_cast<const Context&>(context); }

class VisionLayer : public core::Layer {
 public:
  using core::Layer::Layer;
  std::string tower() const override { return "visual"; }
  bool active(const core::Carry&, const core::Context& context) const override {
    return qwen35(context).has_vision();
  }
};

// patch_embed and pos_embed under model.visual: a module of its own that holds the two (not
// registered anywhere, so the parameters keep their one name).
class EmbedModule : public torch::nn::Module {
 public:
  explicit EmbedModule(const VisionModel& tower) {
    register_module("patch_embed", tower.patch_embed);
    register_module("pos_embed", tower.pos_embed);
  }
};

class PatchEmbedLayer : public VisionLayer {
 public:
  explicit PatchEmbedLayer(std::shared_ptr<VisionModel> tower)
      : VisionLayer("model.visual", std::make_shared<EmbedModule>(*tower)), tower_(std::move(tower)) {}
  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    const Context& c = qwen35(context);
    VisionGeometry g;
    g.indices = c.position_indices;
    g.weights = c.position_weights;
    carry.set("vision_hidden", tower_->embed(c.pixel_values, g));
    return carry;
  }

 private:
  std::shared_ptr<VisionModel> tower_;
};

class VisionBlockLayer : public VisionLayer {
 public:
  VisionBlockLayer(size_t index, std::shared_ptr<VisionBlock> block)
      : VisionLayer(fmt::format("model.visual.blocks.{}", index), block), block_(std::move(block)) {}
  bool block() const override { return true; }
  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    const Context& c = qwen35(context);
    carry.set("vision_hidden",
              block_->forward(carry.get("vision_hidden"), c.vision_cu, c.vision_cos, c.vision_sin));
    return carry;
  }

 private:
  std::shared_ptr<VisionBlock> block_;
};

class MergerLayer : public VisionLayer {
 public:
  explicit MergerLayer(std::shared_ptr<VisionModel> tower)
      : VisionLayer("model.visual.merger", tower->merger), tower_(std::move(tower)) {}
  core::Carry forward(core::Carry carry, const core::Context&) const override {
    carry.set("image_embeds", tower_->merge(carry.take("vision_hidden")));
    return carry;
  }

 private:
  std::shared_ptr<VisionModel> tower_;
};

class TextLayer : public core::Layer {
 public:
  using core::Layer::Layer;
  std::string tower() const override { return "llm"; }
  bool active(const core::Carry&, const core::Context& context) const override {
    return qwen35(context).has_text();
  }
};

class EmbedTokensLayer : public TextLayer {
 public:
  EmbedTokensLayer(std::shared_ptr<parallel::VocabParallelEmbedding> embed, bool tied)
      : TextLayer("model.language_model.embed_tokens", embed),
        embed_(std::move(embed)),
        tied_(tied),
        tp_(embed_->group()) {}
  bool parameters_read_outside() const override { return tied_; }
  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    const Context& c = qwen35(context);
    at::Tensor embeds = embed_->forward(c.input_ids);  // (1, T, hidden)
    if (carry.has("image_embeds")) {
      const at::Tensor vision = carry.take("image_embeds").to(embeds.scalar_type());
      if (c.image_tokens + c.video_tokens != vision.size(0))
        throw ModelError(
            fmt::format("the input ids hold {} image and {} video tokens but the vision tower gives {} "
                        "embeddings",
                        c.image_tokens, c.video_tokens, vision.size(0)));
      if (c.image_tokens > 0)
        embeds = embeds.masked_scatter(c.image_mask, vision.narrow(0, 0, c.image_tokens));
      if (c.video_tokens > 0)
        embeds = embeds.masked_scatter(c.video_mask, vision.narrow(0, c.image_tokens, c.video_tokens));
    } else if (c.image_tokens + c.video_tokens > 0) {
      throw ModelError(
          fmt::format("the input ids hold {} image and {} video tokens but no images or videos are given",
                      c.image_tokens, c.video_tokens));
    }
    if (c.text_shard.enabled()) embeds = c.text_shard.scatter(embeds.squeeze(0)).unsqueeze(0);
    carry.set("hidden", parallel::scatter_sequence(tp_, 1, embeds, c.chunks));
    return carry;
  }

 private:
  std::shared_ptr<parallel::VocabParallelEmbedding> embed_;
  bool tied_;
  parallel::TensorParallelGroup tp_;
};

// Adds one layer's routing over the real tokens to the carry's counts (routing_counts), which the
// norm turns into the load-balancing loss; with a z-loss, the sum of logsumexp(logits)^2 over them.
// The step's report of the load, detached: row `layer` of a (layers, E + 4) table holds the picks
// each expert got, the picks dropped over capacity, and under expert parallelism the rows of the most
// loaded ep rank before and after hot-expert replication and the ranks' mean.
void add_routing(core::Carry& carry, const RouterOutput& router, const at::Tensor& real, int64_t top_k,
                 bool actual_picks, bool z_loss, int64_t layer, int64_t layers) {
  const RoutingCounts counts =
      routing_counts(router.logits, top_k, real, actual_picks ? router.chosen : at::Tensor());
  std::vector<std::pair<const char*, at::Tensor>> sums{{"router_picks", counts.picks},
                                                       {"router_probabilities", counts.probabilities},
                                                       {"router_rows", counts.rows}};
  const at::Tensor mask = real.defined()
                              ? real.to(router.logits.device(), at::kFloat)
                              : at::ones({router.logits.size(0)}, router.logits.options().dtype(at::kFloat));
  if (z_loss)
    sums.emplace_back("router_z", (at::logsumexp(router.logits.to(at::kFloat), -1).pow(2) * mask).sum());
  for (const auto& [name, value] : sums) carry.set(name, carry.has(name) ? carry.get(name) + value : value);
  at::NoGradGuard no_grad;
  const int64_t experts = router.logits.size(-1);
  const at::Tensor real_rows = mask.unsqueeze(-1);  // (T, 1)
  const at::Tensor picks = (at::one_hot(router.chosen, experts).sum(1).to(at::kFloat) * real_rows).sum(0);
  const at::Tensor dropped = router.kept.defined()
                                 ? (router.kept.logical_not().to(at::kFloat) * real_rows).sum().unsqueeze(0)
                                 : at::zeros({1}, picks.options());
  const parallel::ExchangeLoad& load = router.load;
  const at::Tensor ranks = at::tensor({static_cast<float>(load.most_before), static_cast<float>(load.most),
                                       static_cast<float>(load.mean)})
                               .to(picks.device());
  at::Tensor report = carry.has("expert_report") ? carry.get("expert_report")
                                                 : at::zeros({layers, experts + 4}, picks.options());
  report[layer].add_(at::cat({picks, dropped, ranks}));
  carry.set("expert_report", report);
}

class DecoderLayerLayer : public TextLayer {
 public:
  DecoderLayerLayer(size_t index, std::shared_ptr<DecoderLayer> layer, const TextConfig& config)
      : TextLayer(fmt::format("model.language_model.layers.{}", index), layer),
        index_(index),
        layer_(std::move(layer)),
        routing_(config.moe()),
        differentiable_(config.output_router_logits || config.z_loss > 0),
        actual_picks_(config.expert_bias_rate > 0),
        z_loss_(config.z_loss > 0),
        layers_(static_cast<int64_t>(config.layer_types.size())),
        top_k_(config.num_experts_per_tok) {}
  bool block() const override { return true; }
  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    const Context& c = qwen35(context);
    RouterOutput router;
    carry.set("hidden", layer_->forward(carry.get("hidden"), c.cos, c.sin, c.cu_seqlens, nn::fused_kernels(),
                                        routing_ ? &router : nullptr,
                                        c.text_shard.enabled() ? &c.context_parallel : nullptr,
                                        c.decoding ? &c.decoding->at(index_) : nullptr));
    if (routing_) {
      // Without the router losses the counts are only reported: no gradient. With an expert bias the
      // load-balancing loss counts the picks the bias made (else the top k of the logits, as
      // transformers).
      std::optional<at::NoGradGuard> report_only;
      if (!differentiable_) report_only.emplace();
      add_routing(carry, router, c.real_tokens, top_k_, actual_picks_, z_loss_, static_cast<int64_t>(index_),
                  layers_);
    }
    return carry;
  }

 private:
  size_t index_;
  std::shared_ptr<DecoderLayer> layer_;
  bool routing_, differentiable_, actual_picks_, z_loss_;
  int64_t layers_, top_k_;
};

class NormLayer : public TextLayer {
 public:
  NormLayer(std::shared_ptr<ZeroCentredRMSNorm> norm, const TextConfig& config,
            const parallel::TensorParallelGroup& tp)
      : TextLayer("model.language_model.norm", norm),
        norm_(std::move(norm)),
        coefficient_(config.router_aux_loss_coef),
        z_coefficient_(config.z_loss),
        aux_loss_(config.output_router_logits),
        layers_(static_cast<int64_t>(config.layer_types.size())),
        tp_(tp) {}
  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    const Context& c = qwen35(context);
    const at::Tensor h = norm_->forward(parallel::gather_sequence(tp_, 1, carry.take("hidden"), c.chunks));
    // The batch's rows again; under context parallelism the shard's tokens stay one row.
    carry.set("hidden", c.text_shard.enabled() ? h : h.view({c.rows, -1, h.size(-1)}));
    if (carry.has("router_picks")) {
      RoutingCounts pooled{carry.take("router_picks"), carry.take("router_probabilities"),
                           carry.take("router_rows")};
      // Each rank routed its part of the tokens: the counts of all of them. Tensor-parallel ranks then
      // share one loss (each its own copy); context-parallel ranks add theirs, so each takes 1/cp of it
      // and its counts' gradient sums the ranks'.
      const auto& cp = c.text_shard.group;
      at::Tensor z = carry.has("router_z") ? carry.take("router_z") : at::Tensor();
      at::Tensor report = carry.take("expert_report");
      for (at::Tensor* count : {&pooled.picks, &pooled.probabilities, &pooled.rows, &z, &report})
        if (c.chunks.split && count->defined()) *count = dist::reduce_from_region(*count, tp_.comm);
      carry.set("expert_tokens", report);  // the step's report of the experts' load, per layer
      if (aux_loss_ || z.defined()) {
        for (at::Tensor* count : {&pooled.picks, &pooled.probabilities, &pooled.rows, &z})
          if (c.text_shard.enabled() && count->defined()) *count = dist::sum_over_region(*count, cp.cp);
        const double share = c.text_shard.enabled() ? 1.0 / static_cast<double>(cp.size()) : 1.0;
        at::Tensor loss;
        if (aux_loss_) loss = coefficient_ * share * load_balancing_loss(pooled);
        // The z-loss of each layer, the mean over its tokens, summed over the layers: pooled.rows counts
        // every layer's tokens.
        if (z.defined()) {
          const at::Tensor z_loss =
              z_coefficient_ * share * static_cast<double>(layers_) * z / pooled.rows.clamp_min(1);
          loss = loss.defined() ? loss + z_loss : z_loss;
        }
        carry.set("aux_loss", loss);
      }
    }
    return carry;
  }

 private:
  std::shared_ptr<ZeroCentredRMSNorm> norm_;
  double coefficient_, z_coefficient_;
  bool aux_loss_;
  int64_t layers_;
  parallel::TensorParallelGroup tp_;
};

// The real tokens of each row (attention_mask 1), or of each packed sample: [begin, end) per unit,
// checking that padding only ends a row (the layers run each row as one sample from its start).
struct Unit {
  int64_t row, begin, end;
};
std::vector<Unit> units_of(const VisionLanguageInputs& in) {
  const int64_t rows = in.input_ids.size(0), length = in.input_ids.size(1);
  std::vector<Unit> units;
  if (!in.cu_seqlens.empty()) {
    if (rows != 1 || in.cu_seqlens.front() != 0 || in.cu_seqlens.back() != length)
      throw ModelError(
          fmt::format("packed samples need one row and cu_seqlens from 0 to its {} tokens", length));
    for (size_t s = 0; s + 1 < in.cu_seqlens.size(); ++s)
      units.push_back({0, in.cu_seqlens[s], in.cu_seqlens[s + 1]});
    return units;
  }
  const at::Tensor mask = in.attention_mask.defined() ? in.attention_mask.to(at::kLong).cpu()
                                                      : at::ones({rows, length}, at::kLong);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t real = mask[r].sum().item<int64_t>();
    if (real > 0 && mask[r].narrow(0, 0, real).min().item<int64_t>() == 0)
      throw ModelError(
          "Qwen3.5 takes rows padded at their end only (left padding is for generation, which this "
          "version of Loom does not run for Qwen3.5)");
    units.push_back({r, 0, real});
  }
  return units;
}

}  // namespace

at::Tensor rope_position_ids(const VisionLanguageInputs& in, const Config& config) {
  const int64_t rows = in.input_ids.size(0), length = in.input_ids.size(1);
  const int64_t merge = config.vision.spatial_merge_size;
  const at::Tensor ids = in.input_ids.to(at::kLong).cpu().contiguous();
  at::Tensor positions = at::zeros({3, rows, length}, at::kLong);
  // The grids runs of image and video tokens take, in order: a video's temporal patches one by one.
  std::vector<std::pair<int64_t, int64_t>> images, videos;  // merged (rows, columns)
  const auto add = [&](const at::Tensor& grid, std::vector<std::pair<int64_t, int64_t>>& out) {
    if (!grid.defined()) return;
    const at::Tensor g = grid.to(at::kLong).cpu();
    for (int64_t i = 0; i < g.size(0); ++i)
      for (int64_t t = 0; t < g[i][0].item<int64_t>(); ++t)
        out.emplace_back(g[i][1].item<int64_t>() / merge, g[i][2].item<int64_t>() / merge);
  };
  add(in.image_grid_thw, images);
  add(in.video_grid_thw, videos);
  size_t next_image = 0, next_video = 0;
  auto p = positions.accessor<int64_t, 3>();
  const auto id = ids.accessor<int64_t, 2>();
  for (const Unit& u : units_of(in)) {
    int64_t position = 0;
    for (int64_t t = u.begin; t < u.end;) {
      const int64_t token = id[u.row][t];
      const bool image = token == config.image_token_id, video = token == config.video_token_id;
      if (!image && !video) {
        for (int a = 0; a < 3; ++a) p[a][u.row][t] = position;
        ++position, ++t;
        continue;
      }
      auto& grids = image ? images : videos;
      size_t& next = image ? next_image : next_video;
      if (next >= grids.size())
        throw ModelError(fmt::format("the input ids hold more {} blocks than the {} grids given",
                                     image ? "image" : "video", grids.size()));
      const auto [h, w] = grids[next++];
      if (t + h * w > u.end)
        throw ModelError(
            fmt::format("an {} block of {} tokens runs past its sample", image ? "image" : "video", h * w));
      for (int64_t r = 0; r < h; ++r)
        for (int64_t c = 0; c < w; ++c, ++t) {
          p[0][u.row][t] = position;
          p[1][u.row][t] = position + r;
          p[2][u.row][t] = position + c;
        }
      position += std::max(h, w);
    }
  }
  return positions;
}

ForConditionalGeneration::ForConditionalGeneration(const Config& c, const parallel::ParamOptions& options)
    : config(c), tp_(options.tp) {
  model = register_module("model", std::make_shared<torch::nn::Module>());
  parallel::ParamOptions replicated = options;  // the vision tower is whole on every tensor-parallel rank
  replicated.tp = {};
  visual = model->register_module("visual", std::make_shared<VisionModel>(c.vision, replicated));
  language_model = model->register_module("language_model", std::make_shared<TextModel>(c.text, options));
  parallel::ParamOptions head = options;  // after the final norm: whole sequences
  head.tp.sequence_parallel = false;
  if (!c.tie_word_embeddings)
    lm_head = register_module("lm_head", std::make_shared<parallel::ColumnParallelLinear>(
                                             c.text.hidden_size, c.text.vocab_size, false, head));
  layers_.push_back(std::make_shared<PatchEmbedLayer>(visual));
  for (size_t b = 0; b < visual->blocks.size(); ++b)
    layers_.push_back(std::make_shared<VisionBlockLayer>(b, visual->blocks[b]));
  layers_.push_back(std::make_shared<MergerLayer>(visual));
  layers_.push_back(std::make_shared<EmbedTokensLayer>(language_model->embed_tokens, c.tie_word_embeddings));
  for (size_t l = 0; l < language_model->layers.size(); ++l)
    layers_.push_back(std::make_shared<DecoderLayerLayer>(l, language_model->layers[l], c.text));
  layers_.push_back(std::make_shared<NormLayer>(language_model->norm, c.text, tp_));
}

void ForConditionalGeneration::to(torch::Device device, bool non_blocking) {
  torch::nn::Module::to(device, non_blocking);
  device_ = device;
}

std::shared_ptr<const Context> ForConditionalGeneration::context(const VisionLanguageInputs& in,
                                                                 const parallel::ContextParallelGroup* cp,
                                                                 std::vector<LayerDecoding>* decoding) const {
  auto c = std::make_shared<Context>();
  c->decoding = decoding;
  std::vector<at::Tensor> pixels, grids;
  if (in.pixel_values.defined() && in.pixel_values.size(0) > 0) {
    pixels.push_back(in.pixel_values);
    grids.push_back(in.image_grid_thw.to(at::kLong).cpu());
  }
  if (in.pixel_values_videos.defined() && in.pixel_values_videos.size(0) > 0) {
    pixels.push_back(in.pixel_values_videos);
    grids.push_back(in.video_grid_thw.to(at::kLong).cpu());
  }
  if (!pixels.empty()) {
    c->grid_thw = at::cat(grids);
    c->pixel_values = at::cat(pixels).to(device_, /*non_blocking=*/true);
    const VisionGeometry g = visual->geometry(c->grid_thw, device_);
    c->vision_cu = g.cu_seqlens;
    c->vision_cos = g.cos;
    c->vision_sin = g.sin;
    c->position_indices = g.indices;
    c->position_weights = g.weights;
  }
  if (in.input_ids.defined()) {
    const int64_t rows = in.input_ids.size(0), length = in.input_ids.size(1);
    c->rows = rows;
    const at::Tensor positions = position_ids(in);  // (3, B, L)
    std::tie(c->cos, c->sin) = rotary_tables(positions.reshape({3, rows * length}), config.text.rotary,
                                             lm_head_weight().scalar_type());
    // The rows end to end, each one sample, or the given packed samples.
    if (in.cu_seqlens.empty()) {
      units_of(in);  // padding only at the rows' ends
      for (int64_t r = 0; r <= rows; ++r) c->cu_seqlens.push_back(r * length);
    } else {
      c->cu_seqlens = in.cu_seqlens;
    }
    c->real_tokens = (in.attention_mask.defined() && in.cu_seqlens.empty()
                          ? in.attention_mask.reshape({rows * length}).ne(0)
                          : at::ones({rows * length}, at::kBool))
                         .to(device_);
    c->input_ids = in.input_ids.reshape({1, rows * length}).to(device_, /*non_blocking=*/true);
    const at::Tensor flat = in.input_ids.reshape({1, rows * length});
    const at::Tensor image = flat.eq(config.image_token_id), video = flat.eq(config.video_token_id);
    c->image_tokens = image.sum().item<int64_t>();
    c->video_tokens = video.sum().item<int64_t>();
    c->image_mask = image.unsqueeze(-1).to(device_);
    c->video_mask = video.unsqueeze(-1).to(device_);
    int64_t tokens = rows * length;
    if (cp && cp->enabled()) {
      // Every packed sample (or row) causal on its own, its tokens split over the cp ranks.
      std::vector<int64_t> lengths;
      for (size_t i = 0; i + 1 < c->cu_seqlens.size(); ++i)
        lengths.push_back(c->cu_seqlens[i + 1] - c->cu_seqlens[i]);
      c->text_shard =
          parallel::context_shard(*cp, lengths, /*causal=*/true, tp_.sequence_parallel ? tp_.size() : 1);
      c->context_parallel.attention = parallel::context_attention_plan(c->text_shard, c->cu_seqlens);
      c->context_parallel.linear = linear_context_parallel(c->text_shard);
      c->cos = c->text_shard.scatter(c->cos);
      c->sin = c->text_shard.scatter(c->sin);
      c->real_tokens = c->text_shard.scatter(c->real_tokens.to(at::kFloat)).ne(0);
      tokens = c->text_shard.local_length;
    }
    // Sequence parallelism: the padding a sample of its own; each rank's router counts its chunk.
    c->chunks = parallel::sequence_chunks(tp_, tokens);
    parallel::pad_sequence_tables(c->chunks, 0, c->cos, c->sin, {&c->cu_seqlens});
    if (c->chunks.split) {
      const int64_t chunk = c->chunks.padded / tp_.size();
      c->real_tokens = at::constant_pad_nd(c->real_tokens, {0, c->chunks.padded - c->chunks.length})
                           .narrow(0, tp_.rank() * chunk, chunk);
    }
    c->cos = c->cos.to(device_);
    c->sin = c->sin.to(device_);
  }
  return c;
}

std::shared_ptr<const VisionLanguageContext> ForConditionalGeneration::sharded_context(
    const VisionLanguageInputs& inputs, const parallel::ContextParallelGroup& cp) const {
  return context(inputs, &cp);
}

at::Tensor ForConditionalGeneration::position_ids(const VisionLanguageInputs& inputs) const {
  if (inputs.position_ids.defined()) return inputs.position_ids;
  return rope_position_ids(inputs, config);
}

at::Tensor ForConditionalGeneration::image_embeddings(const at::Tensor& pixel_values,
                                                      const at::Tensor& image_grid_thw) const {
  if (!pixel_values.defined() || pixel_values.size(0) == 0)
    return at::empty({0, config.text.hidden_size}, language_model->embed_tokens->weight.options());
  VisionLanguageInputs vision;
  vision.pixel_values = pixel_values;
  vision.image_grid_thw = image_grid_thw;
  return core::run_layers(layers_, {}, *context(vision)).get("image_embeds");
}

at::Tensor ForConditionalGeneration::hidden_states(const VisionLanguageInputs& inputs) const {
  return core::run_layers(layers_, {}, *context(inputs)).get("hidden");
}

const at::Tensor& ForConditionalGeneration::lm_head_weight() const {
  return lm_head ? lm_head->weight : language_model->embed_tokens->weight;
}

// Each tensor-parallel rank's columns of the vocabulary (the task's loss is vocabulary-parallel).
at::Tensor ForConditionalGeneration::logits(const at::Tensor& hidden) const {
  return at::matmul(dist::copy_to_region(hidden, tp_.comm), lm_head_weight().t());
}

at::Tensor ForConditionalGeneration::whole_logits(const at::Tensor& hidden) const {
  return dist::gather_from_region(logits(hidden), tp_.comm, -1);
}

namespace {

// Left-padded prompts become one packed row of their real tokens, each a sample, whose layers keep
// their states; each step then runs one token a row, a sample each, at its row's next position (the
// prompt's largest plus one, then counting up, as transformers' rope deltas give it).
class Decoder : public VisionLanguageDecoder {
 public:
  explicit Decoder(const ForConditionalGeneration& model) : model_(model) {}

  at::Tensor prefill(const VisionLanguageInputs& prompts) override {
    if (!prompts.cu_seqlens.empty()) throw ModelError("decoding prompts come one per row, not packed");
    const int64_t rows = prompts.input_ids.size(0), length = prompts.input_ids.size(1);
    const at::Tensor mask = prompts.attention_mask.defined() ? prompts.attention_mask.to(at::kBool).cpu()
                                                             : at::ones({rows, length}, at::kBool);
    VisionLanguageInputs packed = prompts;
    packed.attention_mask = at::Tensor();
    std::vector<at::Tensor> real;
    packed.cu_seqlens = {0};
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = mask[r].sum().item<int64_t>();
      if (n == 0 || !mask[r].narrow(0, length - n, n).all().item<bool>())
        throw ModelError("decoding prompts must be padded on the left, each with a real token");
      real.push_back(prompts.input_ids[r].narrow(0, length - n, n).cpu());
      packed.cu_seqlens.push_back(packed.cu_seqlens.back() + n);
    }
    packed.input_ids = at::cat(real).unsqueeze(0);
    packed.position_ids = rope_position_ids(packed, model_.config);  // (3, 1, T)
    next_.clear();
    std::vector<int64_t> last;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t begin = packed.cu_seqlens[r], n = packed.cu_seqlens[r + 1] - begin;
      next_.push_back(packed.position_ids.narrow(2, begin, n).max().item<int64_t>() + 1);
      last.push_back(begin + n - 1);
    }
    layers_.assign(model_.language_model->layers.size(), LayerDecoding{});
    return run(packed, rows, /*step=*/false, last);
  }

  at::Tensor step(const at::Tensor& tokens) override {
    if (next_.empty()) throw ModelError("decoding: step() before prefill()");
    const int64_t rows = tokens.size(0);
    if (rows != static_cast<int64_t>(next_.size()))
      throw ModelError(fmt::format("decoding: {} tokens for {} rows", rows, next_.size()));
    VisionLanguageInputs in;
    in.input_ids = tokens.to(at::kLong).cpu().view({1, rows});
    std::vector<int64_t> each;
    for (int64_t r = 0; r <= rows; ++r) each.push_back(r);
    in.cu_seqlens = each;
    in.position_ids = at::tensor(next_, at::kLong).view({1, 1, rows}).expand({3, 1, rows}).contiguous();
    for (int64_t& position : next_) ++position;
    each.pop_back();
    return run(in, rows, /*step=*/true, each);
  }

 private:
  // One pass -> the whole logits of the tokens at `last` (B, vocab). The states are dropped when it
  // throws (a pass cut short leaves the layers uneven).
  at::Tensor run(const VisionLanguageInputs& in, int64_t rows, bool step, const std::vector<int64_t>& last) {
    for (LayerDecoding& layer : layers_) {
      layer.linear.rows = layer.attention.rows = rows;
      layer.linear.step = layer.attention.step = step;
    }
    try {
      const at::Tensor hidden =
          core::run_layers(model_.layers(), {}, *model_.context(in, nullptr, &layers_)).get("hidden");
      const at::Tensor index = at::tensor(last, at::kLong).to(hidden.device());
      return model_.whole_logits(hidden[0].index_select(0, index)).to(at::kFloat);
    } catch (...) {
      next_.clear();
      layers_.clear();
      throw;
    }
  }

  const ForConditionalGeneration& model_;
  std::vector<LayerDecoding> layers_;
  std::vector<int64_t> next_;  // each row's next position
};

}  // namespace

std::unique_ptr<VisionLanguageDecoder> ForConditionalGeneration::decoder() const {
  return std::make_unique<Decoder>(*this);
}

double ForConditionalGeneration::training_flops(const std::vector<int64_t>& sequence_lengths,
                                                const at::Tensor& image_grid_thw) const {
  // 2 FLOPs per multiply-add in the forward, 3x for forward + backward.
  const TextConfig& t = config.text;
  const double h = static_cast<double>(t.hidden_size);
  const AttentionConfig& a = t.attention;
  const GatedDeltaNetConfig& l = t.linear;
  const double q = static_cast<double>(a.num_heads * a.head_dim),
               kv = static_cast<double>(a.num_kv_heads * a.head_dim);
  const double full = 2.0 * h * (2 * q + 2 * kv) + 2.0 * q * h;
  // Projections, and the delta rule's state reads and writes per token and value head.
  const double linear = 2.0 * h * (l.conv_dim() + l.value_dim() + 2.0 * l.num_value_heads) +
                        2.0 * l.value_dim() * h +
                        2.0 * 3 * l.num_value_heads * l.key_head_dim * l.value_head_dim;
  const double mlp =
      t.moe()
          ? 2.0 * 3 * h *
                    (t.moe_intermediate_size * t.num_experts_per_tok + t.shared_expert_intermediate_size) +
                2.0 * h * (t.num_experts + 1)
          : 2.0 * 3 * h * t.intermediate_size;
  int64_t full_layers = 0;
  for (const auto& type : t.layer_types) full_layers += type == "full_attention";
  const double linear_layers = static_cast<double>(t.layer_types.size() - full_layers);
  const double per_token =
      full_layers * full + linear_layers * linear + t.layer_types.size() * mlp + 2.0 * h * t.vocab_size;
  double flops = 0;
  for (auto length : sequence_lengths)
    flops += length * per_token + full_layers * 2.0 * 2.0 * static_cast<double>(length) * length * q;
  if (image_grid_thw.defined() && image_grid_thw.numel() > 0) {
    const VisionConfig& v = config.vision;
    const double width = static_cast<double>(v.hidden_size);
    const double patch =
        static_cast<double>(v.in_channels * v.temporal_patch_size * v.patch_size * v.patch_size);
    const double merged = width * v.spatial_merge_size * v.spatial_merge_size;
    const at::Tensor g = image_grid_thw.to(at::kLong).cpu();
    for (int64_t i = 0; i < g.size(0); ++i) {
      const double frames = g[i][0].item<double>(), frame = g[i][1].item<double>() * g[i][2].item<double>();
      const double rows = frames * frame;
      flops +=
          rows * (2.0 * patch * width +
                  v.depth * (2.0 * 4 * width * width + 2.0 * 2 * width * v.intermediate_size)) +
          v.depth * frames * 2.0 * 2.0 * frame * frame * width +
          rows / (v.spatial_merge_size * v.spatial_merge_size) * (2.0 * merged * merged + 2.0 * merged * h);
    }
  }
  return 3.0 * flops;
}

std::vector<SpecialToken> ForConditionalGeneration::special_tokens() const {
  return {{"image_token_id", config.image_token_id, "<|image_pad|>"},
          {"video_token_id", config.video_token_id, "<|video_pad|>"},
          {"vision_start_token_id", config.vision_start_token_id, "<|vision_start|>"},
          {"vision_end_token_id", config.vision_end_token_id, "<|vision_end|>"}};
}

void ForConditionalGeneration::end_step(const at::Tensor& picks) {
  for (size_t l = 0; l < language_model->layers.size(); ++l)
    if (const auto& moe = language_model->layers[l]->moe)
      moe->update_expert_bias(picks[static_cast<int64_t>(l)]);
}

nlohmann::json ForConditionalGeneration::hf_config() const {
  nlohmann::json hf = config.hf;
  const std::string dtype = checkpoint::hf_torch_dtype(lm_head_weight().scalar_type());
  hf["torch_dtype"] = dtype;
  if (hf.contains("dtype")) hf["dtype"] = dtype;
  return hf;
}

std::vector<std::string> ForConditionalGeneration::freeze_examples() const {
  std::vector<std::string> out{"model.visual", "model.visual.merger", "model.language_model",
                               "model.language_model.layers.0"};
  if (lm_head) out.push_back("lm_head");
  return out;
}

}  // namespace loom::models::qwen3_5
