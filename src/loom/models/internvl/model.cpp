#include "loom/models/internvl/model.h"

#include <fmt/format.h>

#include "loom/checkpoint/hf_export.h"
#include "loom/models/text/decoding.h"
#include "loom/util/errors.h"

namespace loom::models {

namespace {

constexpr int64_t kRowDim = 0;  // the tiles' rows: (N, C)

const InternVLContext& internvl(const core::Context& context) {
  return static_cast<const InternVLContext&>(context);
}

class VisionLayer : public core::Layer {
 public:
  using core::Layer::Layer;
  std::string tower() const override { return "vision_tower"; }
  bool active(const core::Carry&, const core::Context& context) const override {
    return internvl(context).has_images();
  }
};

class EmbeddingsLayer : public VisionLayer {
 public:
  EmbeddingsLayer(std::shared_ptr<InternVisionEmbeddings> embeddings, const InternVisionModel& tower)
      : VisionLayer("vision_tower.embeddings", embeddings),
        embeddings_(std::move(embeddings)),
        tp_(tower.tp) {}

  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    const auto& c = internvl(context);
    const at::Tensor embedded = embeddings_->forward(c.pixel_values);  // (tiles, T, C)
    carry.set("vision_hidden",
              parallel::scatter_sequence(tp_, kRowDim, embedded.flatten(0, 1), c.vision_chunks));
    return carry;
  }

 private:
  std::shared_ptr<InternVisionEmbeddings> embeddings_;
  parallel::TensorParallelGroup tp_;
};

class EncoderLayer : public VisionLayer {
 public:
  EncoderLayer(size_t index, std::shared_ptr<InternVisionLayer> layer)
      : VisionLayer(fmt::format("vision_tower.encoder.layer.{}", index), layer), layer_(std::move(layer)) {}
  bool block() const override { return true; }

  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    carry.set("vision_hidden", layer_->forward(carry.get("vision_hidden"), internvl(context).tile_cu));
    return carry;
  }

 private:
  std::shared_ptr<InternVisionLayer> layer_;
};

class ProjectorLayer : public VisionLayer {
 public:
  ProjectorLayer(std::shared_ptr<InternVLProjector> projector, const InternVisionModel& tower)
      : VisionLayer("multi_modal_projector", projector),
        projector_(std::move(projector)),
        tp_(tower.tp),
        tokens_(tower.config.tile_tokens()),
        grid_(tower.config.grid_side()) {}

  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    const auto& c = internvl(context);
    // The projector runs on whole sequences: sequence parallelism ends before it.
    const at::Tensor rows =
        parallel::gather_sequence(tp_, kRowDim, carry.take("vision_hidden"), c.vision_chunks);
    const at::Tensor patches =
        rows.view({-1, tokens_, rows.size(-1)}).narrow(1, 1, tokens_ - 1);  // CLS dropped
    const at::Tensor shuffled = internvl_pixel_shuffle(patches, grid_);     // (tiles, g^2 / 4, 4C)
    carry.set("image_embeds", projector_->forward(shuffled.flatten(0, 1)));
    return carry;
  }

 private:
  std::shared_ptr<InternVLProjector> projector_;
  parallel::TensorParallelGroup tp_;
  int64_t tokens_, grid_;
};

// 1-D rotary angles (B, L, head_dim) of position ids (B, L): position x theta^(-2i/d), twice.
at::Tensor rotary_angles(const at::Tensor& positions, int64_t head_dim, double theta) {
  const at::Tensor inverse =
      at::pow(theta, at::arange(0, head_dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(head_dim))
          .reciprocal();
  const at::Tensor freqs = positions.to(at::kFloat).unsqueeze(-1) * inverse;  // (B, L, d/2)
  return at::cat({freqs, freqs}, -1);
}

// Decoding (models/text/decoding.h) with 1-D positions: a new token's is the count of real tokens
// before it in its row.
class InternVLDecoder : public CachedDecoder {
 public:
  explicit InternVLDecoder(const InternVLForConditionalGeneration& model)
      : CachedDecoder(model, [&model](const VisionLanguageInputs& in, KVCache* cache) {
          return model.context(in, cache);
        }) {}

 protected:
  at::Tensor prompt_positions(const VisionLanguageInputs& prompts) override {
    return internvl_position_ids(prompts.input_ids, prompts.attention_mask);
  }
  at::Tensor step_positions(int64_t) override {
    return cache().valid.sum(1, /*keepdim=*/true).to(at::kLong).cpu();
  }
};

}  // namespace

at::Tensor internvl_position_ids(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                 const std::vector<int64_t>& cu_seqlens) {
  const int64_t rows = input_ids.size(0), length = input_ids.size(1);
  const at::Tensor mask =
      attention_mask.defined() ? attention_mask.to(at::kLong).cpu() : at::ones({rows, length}, at::kLong);
  if (cu_seqlens.empty()) return (mask.cumsum(1) - 1).masked_fill(mask.eq(0), 1);
  if (rows != 1 || cu_seqlens.front() != 0 || cu_seqlens.back() != length)
    throw ModelError(
        fmt::format("packed position ids need one row and cu_seqlens from 0 to its {} tokens", length));
  at::Tensor positions = at::empty({1, length}, at::kLong);
  for (size_t i = 0; i + 1 < cu_seqlens.size(); ++i) {
    const int64_t begin = cu_seqlens[i], n = cu_seqlens[i + 1] - begin;
    if (n < 0) throw ModelError("packed position ids need rising cu_seqlens");
    positions.narrow(1, begin, n).copy_(at::arange(n, at::kLong).unsqueeze(0));
  }
  return positions;
}

InternVLLanguageModel::InternVLLanguageModel(const TextConfig& c, const parallel::ParamOptions& options) {
  model = register_module("model", std::make_shared<TextModel>(c, options));
  if (auto head = make_lm_head(c, options)) lm_head = register_module("lm_head", head);
}

InternVLForConditionalGeneration::InternVLForConditionalGeneration(
    const InternVLConfig& c, const parallel::ParamOptions& options,
    const std::optional<parallel::TensorParallelGroup>& vision_tp)
    : config(c) {
  if (!c.vision.use_mean_pooling)
    throw ConfigError(
        "vision_config.use_mean_pooling: false (a final vision LayerNorm) is not supported; the published "
        "InternVL models set true");
  parallel::ParamOptions vision_options = options;
  if (vision_tp) vision_options.tp = *vision_tp;
  vision_tower =
      register_module("vision_tower", std::make_shared<InternVisionModel>(c.vision, vision_options));
  multi_modal_projector = register_module("multi_modal_projector",
                                          std::make_shared<InternVLProjector>(c.projector, vision_options));
  language_model =
      register_module("language_model", std::make_shared<InternVLLanguageModel>(c.text(), options));
  layers_.push_back(std::make_shared<EmbeddingsLayer>(vision_tower->embeddings, *vision_tower));
  for (size_t i = 0; i < vision_tower->layers.size(); ++i)
    layers_.push_back(std::make_shared<EncoderLayer>(i, vision_tower->layers[i]));
  layers_.push_back(std::make_shared<ProjectorLayer>(multi_modal_projector, *vision_tower));
  const core::Layers text = text_layers(language_model->model, "language_model.model.");
  layers_.insert(layers_.end(), text.begin(), text.end());
}

void InternVLForConditionalGeneration::to(torch::Device device, bool non_blocking) {
  torch::nn::Module::to(device, non_blocking);
  device_ = device;
}

std::shared_ptr<const InternVLContext> InternVLForConditionalGeneration::context(
    const VisionLanguageInputs& in, KVCache* cache, const parallel::ContextParallelGroup* cp) const {
  if (cache && cp && cp->enabled())
    throw ModelError("decoding with a key/value cache runs without context parallelism");
  if (in.pixel_values_videos.defined() && in.pixel_values_videos.size(0) > 0)
    throw ModelError("InternVL in this version of Loom takes images, not videos");
  auto c = std::make_shared<InternVLContext>();
  if (in.pixel_values.defined() && in.pixel_values.size(0) > 0) {
    const int64_t tiles = in.pixel_values.size(0), tokens = config.vision.tile_tokens();
    c->pixel_values = in.pixel_values;
    c->tile_cu = internvl_tile_cu_seqlens(tiles, tokens);
    c->vision_chunks = parallel::sequence_chunks(vision_tower->tp, tiles * tokens);
    if (c->vision_chunks.padded > c->vision_chunks.length) c->tile_cu.push_back(c->vision_chunks.padded);
    c->pixel_values = c->pixel_values.to(device_, /*non_blocking=*/true);
  }
  if (in.input_ids.defined()) {
    const at::Tensor positions = position_ids(in);
    if (const int64_t limit = config.language.dynamic_rope_limit;
        limit > 0 && positions.numel() > 0 && positions.max().item<int64_t>() >= limit)
      throw ModelError(fmt::format(
          "a sequence reaches position {}, past text_config.max_position_embeddings {}, where the model's "
          "dynamic rope scaling would change the rotary base (not implemented)",
          positions.max().item<int64_t>(), limit));
    const TextConfig& t = config.text();
    add_text_context(*c, in, rotary_angles(positions, t.head_dim(), t.rope_theta), config.image_token_id,
                     /*video_token=*/-1, language_model->model->tp, cp);
    if (cache) add_cached_pass(*c, in, *cache);
    move_text_context(*c, device_);
  }
  return c;
}

std::shared_ptr<const VisionLanguageContext> InternVLForConditionalGeneration::sharded_context(
    const VisionLanguageInputs& inputs, const parallel::ContextParallelGroup& cp) const {
  return context(inputs, nullptr, &cp);
}

at::Tensor InternVLForConditionalGeneration::position_ids(const VisionLanguageInputs& inputs) const {
  if (inputs.position_ids.defined()) return inputs.position_ids;
  return internvl_position_ids(inputs.input_ids, inputs.attention_mask, inputs.cu_seqlens);
}

at::Tensor InternVLForConditionalGeneration::image_embeddings(const at::Tensor& pixel_values,
                                                              const at::Tensor& image_grid_thw) const {
  const TextModel& text = *language_model->model;
  if (!pixel_values.defined() || pixel_values.size(0) == 0)
    return at::empty({0, config.text().hidden_size}, text.embed_tokens->weight.options());
  VisionLanguageInputs vision;  // no input ids: only the vision layers run
  vision.pixel_values = pixel_values;
  vision.image_grid_thw = image_grid_thw;
  return core::run_layers(layers_, {}, *context(vision)).get("image_embeds");
}

at::Tensor InternVLForConditionalGeneration::hidden_states(const VisionLanguageInputs& inputs) const {
  return core::run_layers(layers_, {}, *context(inputs)).get("hidden");
}

const at::Tensor& InternVLForConditionalGeneration::lm_head_weight() const {
  return head_weight(*language_model->model, language_model->lm_head.get());
}

at::Tensor InternVLForConditionalGeneration::logits(const at::Tensor& hidden) const {
  return head_logits(*language_model->model, language_model->lm_head.get(), hidden);
}

at::Tensor InternVLForConditionalGeneration::whole_logits(const at::Tensor& hidden) const {
  return whole_head_logits(*language_model->model, language_model->lm_head.get(), hidden);
}

std::unique_ptr<VisionLanguageDecoder> InternVLForConditionalGeneration::decoder() const {
  return std::make_unique<InternVLDecoder>(*this);
}

double InternVLForConditionalGeneration::training_flops(const std::vector<int64_t>& sequence_lengths,
                                                        const at::Tensor& image_grid_thw) const {
  // 2 FLOPs per multiply-add in the forward, 3x for forward + backward.
  const TextConfig& t = config.text();
  const InternVisionConfig& v = config.vision;
  const double q = t.num_heads * t.head_dim(), kv = t.num_kv_heads * t.head_dim();
  const double per_token_layer =
      2.0 * t.hidden_size * (q * 2 + kv * 2) + 2.0 * 3 * t.hidden_size * t.intermediate_size;
  const double per_token = t.num_layers * per_token_layer + 2.0 * t.hidden_size * t.vocab_size;
  double flops = 0;
  for (auto l : sequence_lengths)
    flops += l * per_token + t.num_layers * 2.0 * 2.0 * static_cast<double>(l) * l * q;
  if (image_grid_thw.defined() && image_grid_thw.numel() > 0) {
    const double tokens = static_cast<double>(v.tile_tokens()), c = static_cast<double>(v.hidden_size);
    const double patch = static_cast<double>(v.num_channels * v.patch_size * v.patch_size);
    const double per_tile =
        2.0 * (tokens - 1) * patch * c +
        v.num_hidden_layers * (tokens * (2.0 * 4 * c * c + 2.0 * 2 * c * v.intermediate_size) +
                               2.0 * 2.0 * tokens * tokens * c) +
        (tokens - 1) / 4 *
            (2.0 * config.projector.in_width * config.projector.out_width +
             2.0 * config.projector.out_width * config.projector.out_width);
    const double tiles = image_grid_thw.to(at::kLong).select(1, 0).sum().item<double>();
    flops += tiles * per_tile;
  }
  return 3.0 * flops;
}

std::vector<SpecialToken> InternVLForConditionalGeneration::special_tokens() const {
  return {{"image_token_id", config.image_token_id, "<IMG_CONTEXT>"}};
}

nlohmann::json InternVLForConditionalGeneration::hf_config() const {
  nlohmann::json hf = config.hf;
  const std::string dtype = checkpoint::hf_torch_dtype(lm_head_weight().scalar_type());
  hf["torch_dtype"] = dtype;
  if (hf.contains("dtype")) hf["dtype"] = dtype;  // transformers 5's name for it
  return hf;
}

std::vector<std::string> InternVLForConditionalGeneration::freeze_examples() const {
  std::vector<std::string> out{"vision_tower", "multi_modal_projector", "language_model.model",
                               "language_model.model.layers.0"};
  if (language_model->lm_head) out.push_back("language_model.lm_head");
  return out;
}

}  // namespace loom::models
