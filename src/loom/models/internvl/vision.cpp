#include "loom/models/internvl/vision.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "loom/models/field_reader.h"
#include "loom/nn/attention.h"
#include "loom/parallel/sequence.h"
#include "loom/util/errors.h"

namespace loom::models {

namespace {

using json = nlohmann::json;

constexpr double kQkNormEps = 1e-6;  // InternVLVisionRMSNorm's default: layer_norm_eps does not reach it
constexpr double kProjectorNormEps = 1e-5;  // torch's LayerNorm default: not layer_norm_eps either
constexpr int64_t kSequenceDim = 0;         // the tiles' tokens are rows: (N, C)

// An int, or a [height, width] pair of equal ints: InternVL's tiles and patches are square.
int64_t square_side(const FieldReader& r, const char* key, int64_t fallback) {
  if (!r.has(key)) return fallback;
  const json& v = r.raw(key);
  if (v.is_number_integer()) return v.get<int64_t>();
  if (!v.is_array() || v.size() != 2 || !v[0].is_number_integer() || !v[1].is_number_integer())
    throw r.error(key, fmt::format("expected an integer or a [height, width] pair, got {}", v.dump()));
  if (v[0] != v[1])
    throw r.error(key, fmt::format("{} is not square (InternVL's tiles and patches are square)", v.dump()));
  return v[0].get<int64_t>();
}

int64_t heads_per_rank(const InternVisionConfig& c, const parallel::ParamOptions& options) {
  return parallel::heads_per_rank(c.num_attention_heads, options.tp.size(), "vision_tp", "the vision tower's",
                                  "attention heads");
}

// The options of a part that runs on whole sequences (sequence parallelism ends before it).
parallel::ParamOptions whole_sequences(const parallel::ParamOptions& options) {
  parallel::ParamOptions whole = options;
  whole.tp.sequence_parallel = false;
  return whole;
}

std::shared_ptr<torch::nn::Module> make_norm(bool rms, int64_t dim, double eps,
                                             const parallel::ParamOptions& options) {
  if (rms) return std::make_shared<nn::RMSNorm>(dim, eps, options);
  return std::make_shared<nn::LayerNorm>(dim, eps, options);
}

}  // namespace

InternVisionConfig parse_intern_vision_config(const json& vision_config, const std::string& source) {
  if (!vision_config.is_object()) throw ConfigError(source + ": vision_config must be a JSON object");
  FieldReader r(vision_config, source, "vision_config.");
  const std::string model_type = r.string("model_type", "internvl_vision");
  if (model_type != "internvl_vision")
    throw r.error("model_type",
                  fmt::format("'{}' is not internvl_vision (the -hf InternVL vision tower)", model_type));
  InternVisionConfig c;
  c.hidden_size = r.integer("hidden_size");
  c.num_hidden_layers = r.integer("num_hidden_layers");
  c.num_attention_heads = r.integer("num_attention_heads");
  c.intermediate_size = r.integer("intermediate_size");
  c.hidden_act = r.string("hidden_act", c.hidden_act);
  c.norm_type = r.string("norm_type", c.norm_type);
  c.layer_norm_eps = r.number("layer_norm_eps", c.layer_norm_eps);
  c.image_size = square_side(r, "image_size", c.image_size);
  c.patch_size = square_side(r, "patch_size", c.patch_size);
  c.num_channels = r.integer("num_channels", c.num_channels);
  c.attention_bias = r.boolean("attention_bias", c.attention_bias);
  c.use_qk_norm = r.boolean("use_qk_norm", c.use_qk_norm);
  c.use_mean_pooling = r.boolean("use_mean_pooling", c.use_mean_pooling);
  c.layer_scale_init_value = r.number("layer_scale_init_value", c.layer_scale_init_value);

  for (auto [key, value] : {std::pair{"hidden_size", c.hidden_size},
                            {"num_hidden_layers", c.num_hidden_layers},
                            {"num_attention_heads", c.num_attention_heads},
                            {"intermediate_size", c.intermediate_size},
                            {"image_size", c.image_size},
                            {"patch_size", c.patch_size},
                            {"num_channels", c.num_channels}})
    if (value <= 0) throw r.error(key, fmt::format("must be positive, got {}", value));
  if (c.hidden_size % c.num_attention_heads)
    throw r.error("num_attention_heads",
                  fmt::format("{} does not divide hidden_size {}", c.num_attention_heads, c.hidden_size));
  if (c.image_size % c.patch_size)
    throw r.error("patch_size", fmt::format("{} does not divide image_size {}", c.patch_size, c.image_size));
  if (c.hidden_act != "gelu")
    throw r.error("hidden_act", fmt::format("'{}' is not supported (valid: gelu)", c.hidden_act));
  if (c.norm_type != "layer_norm" && c.norm_type != "rms_norm")
    throw r.error("norm_type", fmt::format("'{}' is not one of layer_norm, rms_norm", c.norm_type));
  if (!(c.layer_norm_eps > 0))
    throw r.error("layer_norm_eps", fmt::format("must be > 0, got {}", c.layer_norm_eps));
  if (!r.boolean("use_absolute_position_embeddings", true))
    throw r.error("use_absolute_position_embeddings",
                  "false is not supported (the tower adds its absolute position embeddings)");
  if (r.boolean("use_mask_token", false))
    throw r.error("use_mask_token", "true is not supported (masked image modelling is not part of InternVL)");
  for (const char* key : {"hidden_dropout_prob", "attention_dropout", "projection_dropout"}) {
    const double p = r.number(key, 0.0);
    if (p != 0)
      throw r.error(key, fmt::format("{} is not supported (Loom's vision tower has no dropout: 0)", p));
  }
  return c;
}

InternVLProjectorConfig parse_internvl_projector_config(const json& hf, const InternVisionConfig& vision,
                                                        const std::string& source) {
  if (!hf.is_object()) throw ConfigError(source + ": a model config must be a JSON object");
  FieldReader top(hf, source);
  const double ratio = top.number("downsample_ratio", 0.5);
  if (ratio != 0.5)
    throw top.error("downsample_ratio",
                    fmt::format("{} is not supported (valid: 0.5, a 2x2 pixel shuffle)", ratio));
  if (vision.grid_side() % 2)
    throw top.error(
        "downsample_ratio",
        fmt::format("0.5 needs an even patch grid, but vision_config.image_size / patch_size is {}",
                    vision.grid_side()));
  const std::string act = top.string("projector_hidden_act", "gelu");
  if (act != "gelu")
    throw top.error("projector_hidden_act", fmt::format("'{}' is not supported (valid: gelu)", act));
  if (top.has("vision_feature_layer") &&
      !(top.raw("vision_feature_layer").is_number_integer() && top.raw("vision_feature_layer") == -1))
    throw top.error("vision_feature_layer",
                    fmt::format("{} is not supported (valid: -1, the last layer's output)",
                                top.raw("vision_feature_layer").dump()));
  const std::string strategy = top.string("vision_feature_select_strategy", "default");
  if (strategy != "default")
    throw top.error("vision_feature_select_strategy",
                    fmt::format("'{}' is not supported (valid: default, the CLS token dropped)", strategy));
  if (!top.has("text_config") || !hf["text_config"].is_object())
    throw top.error("text_config", "missing (the projector's width is text_config.hidden_size)");
  FieldReader text(hf["text_config"], source, "text_config.");
  InternVLProjectorConfig c;
  c.in_width = 4 * vision.hidden_size;
  c.out_width = text.integer("hidden_size");
  if (c.out_width <= 0) throw text.error("hidden_size", fmt::format("must be positive, got {}", c.out_width));
  const int64_t tokens = c.tokens_per_tile(vision);
  if (top.has("image_seq_length") && top.integer("image_seq_length") != tokens)
    throw top.error(
        "image_seq_length",
        fmt::format("{} does not match the {} tokens a tile gives ((image_size / patch_size)^2 / 4)",
                    top.integer("image_seq_length"), tokens));
  return c;
}

InternVisionPatchProjection::InternVisionPatchProjection(const InternVisionConfig& c,
                                                         const parallel::ParamOptions& options) {
  weight = register_parameter("weight", at::empty({c.hidden_size, c.num_channels, c.patch_size, c.patch_size},
                                                  options.tensor_options()));
  bias = register_parameter("bias", at::empty({c.hidden_size}, options.tensor_options()));
}

InternVisionEmbeddings::InternVisionEmbeddings(const InternVisionConfig& c,
                                               const parallel::ParamOptions& options)
    : config_(c) {
  cls_token = register_parameter("cls_token", at::empty({1, 1, c.hidden_size}, options.tensor_options()));
  position_embeddings = register_parameter(
      "position_embeddings", at::empty({1, c.tile_tokens(), c.hidden_size}, options.tensor_options()));
  patch_embeddings = register_module("patch_embeddings", std::make_shared<nn::ModuleList>());
  projection = patch_embeddings->add("projection", std::make_shared<InternVisionPatchProjection>(c, options));
}

at::Tensor InternVisionEmbeddings::forward(const at::Tensor& pixel_values) const {
  const int64_t channels = config_.num_channels, side = config_.image_size, p = config_.patch_size,
                g = config_.grid_side();
  if (pixel_values.dim() != 4 || pixel_values.size(1) != channels || pixel_values.size(2) != side ||
      pixel_values.size(3) != side)
    throw ModelError(fmt::format(
        "pixel_values of shape [{}]: the vision tower takes (tiles, {}, {}, {}), its image_size (position "
        "embeddings are not interpolated)",
        fmt::join(pixel_values.sizes(), ", "), channels, side, side));
  const int64_t tiles = pixel_values.size(0);
  const at::Tensor& weight = projection->weight;
  // A stride-equals-kernel Conv2d is a matrix product with each patch's pixels in the kernel's
  // (channel, y, x) order; patches row-major over the tile.
  const at::Tensor patches = pixel_values.to(weight.scalar_type())
                                 .reshape({tiles, channels, g, p, g, p})
                                 .permute({0, 2, 4, 1, 3, 5})
                                 .reshape({tiles, g * g, channels * p * p});
  const at::Tensor embedded = at::linear(patches, weight.flatten(1), projection->bias);  // (tiles, g^2, C)
  return at::cat({cls_token.expand({tiles, 1, -1}), embedded}, 1) + position_embeddings;
}

InternVisionAttention::InternVisionAttention(const InternVisionConfig& c,
                                             const parallel::ParamOptions& options)
    : num_heads(heads_per_rank(c, options)) {
  const int64_t width = c.hidden_size;
  // Each rank takes its heads' rows of q, k and v, and the matching columns of projection_layer.
  q_proj = register_module(
      "q_proj", std::make_shared<parallel::ColumnParallelLinear>(width, width, c.attention_bias, options));
  k_proj = register_module(
      "k_proj", std::make_shared<parallel::ColumnParallelLinear>(width, width, c.attention_bias, options));
  v_proj = register_module(
      "v_proj", std::make_shared<parallel::ColumnParallelLinear>(width, width, c.attention_bias, options));
  projection_layer = register_module("projection_layer", std::make_shared<parallel::RowParallelLinear>(
                                                             width, width, /*bias=*/true, options));
  if (c.use_qk_norm) {
    // The norm spans every head; a rank holds its heads' features of q and k (and of the gain), so the
    // sums of squares are all-reduced over tp. It runs inside the tensor-parallel region, on whole
    // sequences: hence no sequence parallelism in its options.
    const auto whole = whole_sequences(options);
    q_norm = register_module("q_norm", std::make_shared<nn::SplitRMSNorm>(width, kQkNormEps, whole));
    k_norm = register_module("k_norm", std::make_shared<nn::SplitRMSNorm>(width, kQkNormEps, whole));
  }
}

at::Tensor InternVisionAttention::forward(const at::Tensor& x, const std::vector<int64_t>& cu_seqlens) const {
  const at::Tensor whole = q_proj->group().enter(x, kSequenceDim);
  const int64_t n = whole.size(0);
  at::Tensor q = q_proj->forward(whole), k = k_proj->forward(whole);  // (N, C / tp)
  if (q_norm) {
    q = q_norm->forward(q);
    k = k_norm->forward(k);
  }
  auto heads = [&](const at::Tensor& t) { return t.reshape({n, num_heads, -1}); };  // (N, H, D)
  const at::Tensor out = nn::segment_attention(heads(q), heads(k), heads(v_proj->forward(whole)), cu_seqlens);
  return projection_layer->forward(out.reshape({n, -1}), kSequenceDim);
}

InternVisionMlp::InternVisionMlp(const InternVisionConfig& c, const parallel::ParamOptions& options) {
  fc1 = register_module("fc1", std::make_shared<parallel::ColumnParallelLinear>(
                                   c.hidden_size, c.intermediate_size, true, options));
  fc2 = register_module("fc2", std::make_shared<parallel::RowParallelLinear>(c.intermediate_size,
                                                                             c.hidden_size, true, options));
}

at::Tensor InternVisionMlp::forward(const at::Tensor& x) const {
  return fc2->forward(at::gelu(fc1->forward(fc1->group().enter(x, kSequenceDim))), kSequenceDim);
}

InternVisionLayer::InternVisionLayer(const InternVisionConfig& c, const parallel::ParamOptions& options)
    : rms_(c.rms_norm()), tp_(options.tp) {
  lambda_1 = register_parameter("lambda_1", at::empty({c.hidden_size}, options.tensor_options()));
  lambda_2 = register_parameter("lambda_2", at::empty({c.hidden_size}, options.tensor_options()));
  attention = register_module("attention", std::make_shared<InternVisionAttention>(c, options));
  mlp = register_module("mlp", std::make_shared<InternVisionMlp>(c, options));
  layernorm_before =
      register_module("layernorm_before", make_norm(rms_, c.hidden_size, c.layer_norm_eps, options));
  layernorm_after =
      register_module("layernorm_after", make_norm(rms_, c.hidden_size, c.layer_norm_eps, options));
}

std::map<std::string, parallel::ShardLayout> InternVisionLayer::layouts() const {
  return {{"lambda_1", parallel::whole_layout(tp_)}, {"lambda_2", parallel::whole_layout(tp_)}};
}

at::Tensor InternVisionLayer::norm(const torch::nn::Module& n, const at::Tensor& x) const {
  if (rms_) return static_cast<const nn::RMSNorm&>(n).forward(x);
  return static_cast<const nn::LayerNorm&>(n).forward(x);
}

at::Tensor InternVisionLayer::forward(const at::Tensor& x, const std::vector<int64_t>& cu_seqlens) const {
  // Layer scale multiplies each sublayer's output per channel before the residual add.
  const at::Tensor h = x + lambda_1 * attention->forward(norm(*layernorm_before, x), cu_seqlens);
  return h + lambda_2 * mlp->forward(norm(*layernorm_after, h));
}

InternVisionModel::InternVisionModel(const InternVisionConfig& c, const parallel::ParamOptions& options)
    : config(c), tp(options.tp) {
  // The embeddings and the final norm run on whole sequences; sequence parallelism covers the blocks.
  const auto whole = whole_sequences(options);
  embeddings = register_module("embeddings", std::make_shared<InternVisionEmbeddings>(c, whole));
  auto encoder = register_module("encoder", std::make_shared<nn::ModuleList>());
  auto list = encoder->add("layer", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    layers.push_back(list->append(std::make_shared<InternVisionLayer>(c, options)));
  if (!c.use_mean_pooling)
    layernorm =
        register_module("layernorm", std::make_shared<nn::LayerNorm>(c.hidden_size, c.layer_norm_eps, whole));
}

at::Tensor InternVisionModel::forward(const at::Tensor& pixel_values) const {
  const at::Tensor embedded = embeddings->forward(pixel_values);  // (tiles, T, C)
  const int64_t tiles = embedded.size(0), tokens = embedded.size(1);
  // The tiles packed as rows, one attention segment each; under sequence parallelism each rank's
  // blocks see one chunk of them, and the padding is a segment of its own.
  std::vector<int64_t> cu = internvl_tile_cu_seqlens(tiles, tokens);
  const parallel::SequenceChunks chunks = parallel::sequence_chunks(tp, tiles * tokens);
  if (chunks.padded > chunks.length) cu.push_back(chunks.padded);
  at::Tensor hidden =
      parallel::scatter_sequence(tp, kSequenceDim, embedded.reshape({tiles * tokens, -1}), chunks);
  for (const auto& layer : layers) hidden = layer->forward(hidden, cu);
  hidden = parallel::gather_sequence(tp, kSequenceDim, hidden, chunks);
  if (layernorm) hidden = layernorm->forward(hidden);
  return hidden.reshape({tiles, tokens, -1});
}

InternVLProjector::InternVLProjector(const InternVLProjectorConfig& c,
                                     const parallel::ParamOptions& options) {
  const auto whole = whole_sequences(options);
  layer_norm =
      register_module("layer_norm", std::make_shared<nn::LayerNorm>(c.in_width, kProjectorNormEps, whole));
  linear_1 = register_module(
      "linear_1", std::make_shared<parallel::ColumnParallelLinear>(c.in_width, c.out_width, true, whole));
  linear_2 = register_module(
      "linear_2", std::make_shared<parallel::RowParallelLinear>(c.out_width, c.out_width, true, whole));
}

at::Tensor InternVLProjector::forward(const at::Tensor& x) const {
  const at::Tensor h = linear_1->forward(linear_1->group().enter(layer_norm->forward(x), kSequenceDim));
  return linear_2->forward(at::gelu(h), kSequenceDim);  // exact (erf) GELU
}

std::vector<int64_t> internvl_tile_cu_seqlens(int64_t tiles, int64_t tile_tokens) {
  std::vector<int64_t> cu{0};
  for (int64_t i = 0; i < tiles; ++i) cu.push_back(cu.back() + tile_tokens);
  return cu;
}

at::Tensor internvl_pixel_shuffle(const at::Tensor& patches, int64_t grid_side) {
  if (patches.dim() != 3 || patches.size(1) != grid_side * grid_side || grid_side % 2)
    throw ModelError(
        fmt::format("pixel shuffle: patches of shape [{}] are not (tiles, {}, C) of an even grid side {}",
                    fmt::join(patches.sizes(), ", "), grid_side * grid_side, grid_side));
  const int64_t tiles = patches.size(0), width = patches.size(2), half = grid_side / 2;
  // (tiles, i, dy, j, dx, C) -> (tiles, i, j, dy, dx, C): each 2x2 block's patches side by side.
  return patches.reshape({tiles, half, 2, half, 2, width})
      .permute({0, 1, 3, 2, 4, 5})
      .reshape({tiles, half * half, 4 * width});
}

InternVLImageFeatures internvl_image_features(const InternVisionModel& tower,
                                              const InternVLProjector& projector,
                                              const at::Tensor& pixel_values) {
  const at::Tensor hidden = tower.forward(pixel_values);               // (tiles, 1 + g^2, C)
  const at::Tensor patches = hidden.narrow(1, 1, hidden.size(1) - 1);  // the CLS dropped
  const at::Tensor tokens = internvl_pixel_shuffle(patches, tower.config.grid_side()).flatten(0, 1);
  if (tokens.size(1) != projector.layer_norm->weight.size(0))
    throw ModelError(fmt::format("the projector takes {} features per token, the pixel shuffle gives {}",
                                 projector.layer_norm->weight.size(0), tokens.size(1)));
  return {hidden, projector.forward(tokens)};  // image_embeds (tiles * g^2 / 4, D)
}

}  // namespace loom::models
