// InternVL's vision side (transformers' InternVLVisionModel and InternVLMultiModalProjector, -hf names):
// InternViT over square tiles (conv patch embedding, CLS token, absolute positions, pre-norm blocks with
// layer scale, non-causal attention within each tile), then the tiles' patch features pixel-shuffled 2x2
// into one token each and projected to the language model's width.
//
// Shapes: pixel_values (tiles, 3, S, S) -> last hidden state (tiles, 1 + g^2, C), g = S / patch (CLS
// first) -> image embeddings (tiles * g^2 / 4, D), tile by tile, each tile's tokens row-major.
// Tensor parallelism (options.tp): the attention heads and the MLP are split like Qwen2-VL's vision
// blocks (q/k/v and fc1 column-parallel, projection_layer and fc2 row-parallel: an all-reduce each);
// the q/k norm spans the whole width and all-reduces its sums of squares (nn::SplitRMSNorm). Under
// sequence parallelism the blocks see one chunk of the packed tiles' rows.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/nn/module_list.h"
#include "loom/nn/norm.h"
#include "loom/parallel/tensor.h"

namespace loom::models {

// vision_config of an InternVL -hf config.json (InternVLVisionConfig's fields; defaults are its own).
struct InternVisionConfig {
  int64_t hidden_size = 1024;  // C
  int64_t num_hidden_layers = 24;
  int64_t num_attention_heads = 16;
  int64_t intermediate_size = 4096;
  std::string hidden_act = "gelu";       // exact (erf) GELU, the only one supported
  std::string norm_type = "layer_norm";  // layer_norm | rms_norm: the blocks' two norms
  double layer_norm_eps = 1e-6;          // the blocks' norms and the final layernorm
  int64_t image_size = 448;              // tiles are image_size x image_size
  int64_t patch_size = 14;
  int64_t num_channels = 3;
  bool attention_bias = false;          // q/k/v biases (projection_layer always has one)
  bool use_qk_norm = false;             // RMSNorm of q and k over the whole width, eps 1e-6
  bool use_mean_pooling = true;         // false: a final LayerNorm (vision_tower.layernorm)
  double layer_scale_init_value = 0.1;  // lambda_1/2's initial value; checkpoints hold their own

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  int64_t grid_side() const { return image_size / patch_size; }          // g: patches per tile side
  int64_t tile_tokens() const { return 1 + grid_side() * grid_side(); }  // CLS + patches
  bool rms_norm() const { return norm_type == "rms_norm"; }
};

// multi_modal_projector: LayerNorm(4C, eps 1e-5) -> Linear(4C, D) -> GELU -> Linear(D, D).
struct InternVLProjectorConfig {
  int64_t in_width = 4096;  // 4C: the four patches of a 2x2 block side by side
  int64_t out_width = 896;  // D: the language model's hidden_size
  int64_t tokens_per_tile(const InternVisionConfig& vision) const {
    return vision.grid_side() * vision.grid_side() / 4;
  }
};

// Reads the vision_config object of a config.json (`source` names the file in errors, the fields are
// named vision_config.<key>). hidden_size, num_hidden_layers, num_attention_heads and intermediate_size
// are required, the others default as in transformers. image_size and patch_size may be an int or a
// [height, width] pair (square only). ConfigError for a bad value and for what the tower does not compute:
// another activation or norm type, no absolute position embeddings, a mask token, dropout.
InternVisionConfig parse_intern_vision_config(const nlohmann::json& vision_config, const std::string& source);

// Reads the top-level fields that decide the features reaching the language model: downsample_ratio
// (0.5 only, which needs an even patch grid), projector_hidden_act (gelu), vision_feature_layer (-1:
// the last layer), vision_feature_select_strategy (default: CLS dropped), image_seq_length (when given,
// g^2 / 4) and text_config.hidden_size (D). ConfigError naming `source` and the field otherwise.
InternVLProjectorConfig parse_internvl_projector_config(const nlohmann::json& hf,
                                                        const InternVisionConfig& vision,
                                                        const std::string& source);

// The patch embedding's Conv2d(channels, C, kernel = stride = patch), stored in conv layout and applied
// as a matrix product over each patch's flattened pixels.
class InternVisionPatchProjection : public torch::nn::Module {
 public:
  InternVisionPatchProjection(const InternVisionConfig& config, const parallel::ParamOptions& options);
  at::Tensor weight;  // (C, channels, patch, patch)
  at::Tensor bias;    // (C)
};

// embeddings.*: patches, CLS prepended, positions added (to the CLS too). Tiles must be image_size
// square: the position embeddings are not interpolated (ModelError otherwise).
class InternVisionEmbeddings : public torch::nn::Module {
 public:
  InternVisionEmbeddings(const InternVisionConfig& config, const parallel::ParamOptions& options);
  at::Tensor forward(const at::Tensor& pixel_values) const;  // (tiles, channels, S, S) -> (tiles, 1 + g^2, C)
  at::Tensor cls_token;                                      // (1, 1, C)
  at::Tensor position_embeddings;                            // (1, 1 + g^2, C), row 0 the CLS's
  std::shared_ptr<nn::ModuleList> patch_embeddings;          // holds projection.{weight, bias}
  std::shared_ptr<InternVisionPatchProjection> projection;

 private:
  InternVisionConfig config_;
};

// attention.*: separate q/k/v, the optional q/k norm over the whole width (before the heads are split),
// scale head_dim^-0.5, no mask within a segment, projection_layer with a bias.
class InternVisionAttention : public torch::nn::Module {
 public:
  InternVisionAttention(const InternVisionConfig& config, const parallel::ParamOptions& options);
  // x (N, C) rows -> (N, C), each row attending to the rows of its cu_seqlens segment (its tile).
  at::Tensor forward(const at::Tensor& x, const std::vector<int64_t>& cu_seqlens) const;
  std::shared_ptr<parallel::ColumnParallelLinear> q_proj, k_proj, v_proj;
  std::shared_ptr<parallel::RowParallelLinear> projection_layer;
  std::shared_ptr<nn::SplitRMSNorm> q_norm, k_norm;  // null without use_qk_norm
  int64_t num_heads;                                 // this rank's
};

// mlp.*: fc1 -> GELU (erf) -> fc2, with biases.
class InternVisionMlp : public torch::nn::Module {
 public:
  InternVisionMlp(const InternVisionConfig& config, const parallel::ParamOptions& options);
  at::Tensor forward(const at::Tensor& x) const;  // (N, C) -> (N, C)
  std::shared_ptr<parallel::ColumnParallelLinear> fc1;
  std::shared_ptr<parallel::RowParallelLinear> fc2;
};

// encoder.layer.<i>: x += lambda_1 * attention(norm_before(x)); x += lambda_2 * mlp(norm_after(x)).
class InternVisionLayer : public torch::nn::Module, public parallel::Sharded {
 public:
  InternVisionLayer(const InternVisionConfig& config, const parallel::ParamOptions& options);
  at::Tensor forward(const at::Tensor& x, const std::vector<int64_t>& cu_seqlens) const;  // (N, C) -> (N, C)
  // lambda_1/2: whole, partial gradients under sequence parallelism (like the norms).
  std::map<std::string, parallel::ShardLayout> layouts() const override;
  at::Tensor lambda_1, lambda_2;                                         // (C)
  std::shared_ptr<torch::nn::Module> layernorm_before, layernorm_after;  // nn::LayerNorm or nn::RMSNorm
  std::shared_ptr<InternVisionAttention> attention;
  std::shared_ptr<InternVisionMlp> mlp;

 private:
  at::Tensor norm(const torch::nn::Module& n, const at::Tensor& x) const;
  bool rms_;
  parallel::TensorParallelGroup tp_;
};

// vision_tower.*: embeddings, encoder.layer, layernorm (only without use_mean_pooling).
class InternVisionModel : public torch::nn::Module {
 public:
  InternVisionModel(const InternVisionConfig& config, const parallel::ParamOptions& options);
  // pixel_values (tiles, channels, S, S) -> last hidden state (tiles, 1 + g^2, C), whole on every rank.
  at::Tensor forward(const at::Tensor& pixel_values) const;
  std::shared_ptr<InternVisionEmbeddings> embeddings;
  std::vector<std::shared_ptr<InternVisionLayer>> layers;
  std::shared_ptr<nn::LayerNorm> layernorm;  // null with use_mean_pooling
  InternVisionConfig config;
  parallel::TensorParallelGroup tp;
};

// multi_modal_projector.*: layer_norm, linear_1 (column-parallel), GELU, linear_2 (row-parallel).
class InternVLProjector : public torch::nn::Module {
 public:
  InternVLProjector(const InternVLProjectorConfig& config, const parallel::ParamOptions& options);
  at::Tensor forward(const at::Tensor& x) const;  // (N, 4C) -> (N, D), whole on every rank
  std::shared_ptr<nn::LayerNorm> layer_norm;
  std::shared_ptr<parallel::ColumnParallelLinear> linear_1;
  std::shared_ptr<parallel::RowParallelLinear> linear_2;
};

// Segments of the packed tiles' rows: tile i is rows [i * tile_tokens, (i + 1) * tile_tokens).
std::vector<int64_t> internvl_tile_cu_seqlens(int64_t tiles, int64_t tile_tokens);

// InternVLModel.pixel_shuffle at ratio 0.5 in closed form: patches (tiles, g^2, C), row-major ->
// (tiles, g^2 / 4, 4C), token (i, j) row-major = [p(2i, 2j), p(2i, 2j+1), p(2i+1, 2j), p(2i+1, 2j+1)].
at::Tensor internvl_pixel_shuffle(const at::Tensor& patches, int64_t grid_side);

struct InternVLImageFeatures {
  at::Tensor vision_hidden;  // (tiles, 1 + g^2, C): the tower's last hidden state, CLS first
  at::Tensor image_embeds;   // (tiles * g^2 / 4, D): the rows that replace the <IMG_CONTEXT> tokens
};

// get_image_features: the tower, the CLS dropped, the pixel shuffle, the projector.
InternVLImageFeatures internvl_image_features(const InternVisionModel& tower,
                                              const InternVLProjector& projector,
                                              const at::Tensor& pixel_values);

}  // namespace loom::models
