// InternVL for conditional generation (InternVL2.5 / 3 / 3.5, -hf layout): InternViT over the image
// tiles, the pixel-shuffle projector, and a Qwen2 or Qwen3 language model whose <IMG_CONTEXT> tokens
// take the image embeddings, with 1-D rotary positions. As an ordered list of layers (core/layer.h):
//
//   vision_tower.embeddings          pixel_values (tiles, 3, S, S) -> vision_hidden: the tiles' rows,
//                                    CLS first (this rank's chunk under sequence parallelism)
//   vision_tower.encoder.layer.<i>   vision_hidden -> vision_hidden, attention within each tile
//   multi_modal_projector            vision_hidden -> image_embeds (whole; CLS dropped, 2x2 pixel
//                                    shuffle, LayerNorm, MLP)
//   language_model.model.*           models/text/layers.h
//
// Context parallelism splits the language model's tokens; every rank of a cp group runs the vision
// tower on all of the micro-batch's tiles (its gradients, from each rank's own image tokens, sum to
// the whole over the group).
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/models/internvl/config.h"
#include "loom/models/internvl/vision.h"
#include "loom/models/text/decoder.h"
#include "loom/models/text/layers.h"
#include "loom/models/vision_language.h"

namespace loom::models {

// What every layer of one micro-batch reads: the language model's part (TextContext) and the tiles.
struct InternVLContext : TextContext {
  at::Tensor pixel_values;       // (tiles, 3, S, S); undefined: no images
  std::vector<int64_t> tile_cu;  // each tile's rows as an attention segment (and sequence-parallel padding's)
  parallel::SequenceChunks vision_chunks;
  bool has_images() const { return pixel_values.defined(); }
};

// 1-D position ids (B, L): each row's real tokens count up from 0 (from 0 again at every packed
// sample of cu_seqlens); padding (attention_mask 0) takes 1.
at::Tensor internvl_position_ids(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                 const std::vector<int64_t>& cu_seqlens = {});

// language_model.*: the decoder (model.*) and, untied, its head (lm_head).
class InternVLLanguageModel : public torch::nn::Module {
 public:
  InternVLLanguageModel(const TextConfig& config, const parallel::ParamOptions& options);
  std::shared_ptr<TextModel> model;
  std::shared_ptr<parallel::ColumnParallelLinear> lm_head;  // null when tied to the embedding
};

class InternVLForConditionalGeneration : public torch::nn::Module, public VisionLanguageModel {
 public:
  // The vision tower and projector are split over `vision_tp` when given, otherwise over options.tp.
  InternVLForConditionalGeneration(
      const InternVLConfig& config, const parallel::ParamOptions& options,
      const std::optional<parallel::TensorParallelGroup>& vision_tp = std::nullopt);

  // The context the layers read for `inputs` (position ids 1-D unless given), decoding over `cache`
  // when given, the tokens sharded over `cp` when it is enabled.
  std::shared_ptr<const InternVLContext> context(const VisionLanguageInputs& inputs, KVCache* cache = nullptr,
                                                 const parallel::ContextParallelGroup* cp = nullptr) const;

  std::shared_ptr<const VisionLanguageContext> sharded_context(
      const VisionLanguageInputs& inputs, const parallel::ContextParallelGroup& cp) const override;
  // (tiles * tokens per tile, hidden); (0, hidden) without tiles.
  at::Tensor image_embeddings(const at::Tensor& pixel_values,
                              const at::Tensor& image_grid_thw) const override;
  at::Tensor hidden_states(const VisionLanguageInputs& inputs) const override;
  at::Tensor logits(const at::Tensor& hidden) const override;
  at::Tensor whole_logits(const at::Tensor& hidden) const override;
  int64_t vocab_start() const override { return language_model->model->embed_tokens->vocab_start(); }
  const at::Tensor& lm_head_weight() const override;
  const parallel::TensorParallelGroup& llm_tp() const override { return language_model->model->tp; }
  at::Tensor position_ids(const VisionLanguageInputs& inputs) const override;
  std::unique_ptr<VisionLanguageDecoder> decoder() const override;
  double training_flops(const std::vector<int64_t>& sequence_lengths,
                        const at::Tensor& image_grid_thw) const override;
  // The image token (<IMG_CONTEXT>).
  std::vector<SpecialToken> special_tokens() const override;
  int64_t vocab_size() const override { return config.text().vocab_size; }
  int64_t hidden_size() const override { return config.text().hidden_size; }
  int64_t max_position_embeddings() const override { return config.text().max_position_embeddings; }
  int64_t bos_token_id() const override { return config.language.bos_token_id; }

  using torch::nn::Module::to;
  void to(torch::Device device, bool non_blocking = false) override;
  torch::nn::Module& module() override { return *this; }
  core::Layers layers() const override { return layers_; }
  nlohmann::json hf_config() const override;
  std::vector<std::string> freeze_examples() const override;

  std::shared_ptr<InternVisionModel> vision_tower;
  std::shared_ptr<InternVLProjector> multi_modal_projector;
  std::shared_ptr<InternVLLanguageModel> language_model;
  InternVLConfig config;

 private:
  core::Layers layers_;
  at::Device device_ = at::kCPU;
};

}  // namespace loom::models
