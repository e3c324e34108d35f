// Qwen3.5 (dense and MoE) for conditional generation, with HuggingFace's names: model.visual (the
// vision tower), model.language_model (the hybrid language model) and lm_head. As an ordered list
// of layers (core/layer.h):
//
//   model.visual                    pixel rows -> vision_hidden: patch embedding plus the learned
//                                   positions resampled to each grid (patch_embed, pos_embed)
//   model.visual.blocks.<i>         vision_hidden -> vision_hidden, attention within each frame
//   model.visual.merger             vision_hidden -> image_embeds: the images' rows, then the videos'
//   model.language_model.embed_tokens  input ids, image and video embeddings scattered in -> hidden
//   model.language_model.layers.<i>    hidden -> hidden (Gated DeltaNet or gated attention; dense or MoE)
//   model.language_model.norm       hidden -> hidden
//
// A MoE model also carries each layer's routing counts (router_picks, router_probabilities,
// router_rows: the top-k picks and the routing probabilities summed over the real tokens, and their
// count) to the norm, which reports the picks (expert_tokens: the step's experts' load) and, when the
// config asks for the router logits (output_router_logits), turns them into aux_loss:
// router_aux_loss_coef times transformers' load-balancing loss over every layer.
//
// The language model runs on one packed row: a batch's rows are laid end to end, each a sample of
// its own (or the given cu_seqlens' samples), so the convolution, the delta rule's state and
// attention all restart at every sample. Positions are Qwen3.5's M-RoPE (rope_position_ids).
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "loom/models/qwen3_5/config.h"
#include "loom/models/vision_language.h"
#include "loom/parallel/sequence.h"

namespace loom::models::qwen3_5 {

// What every layer of one micro-batch reads.
struct Context : VisionLanguageContext {
  at::Tensor input_ids;  // (1, T): the rows end to end; undefined: only the vision tower runs
  int64_t rows = 1;      // the batch's rows, each of T / rows tokens
  std::vector<int64_t> cu_seqlens;
  at::Tensor image_mask, video_mask;  // (1, T, 1)
  int64_t image_tokens = 0, video_tokens = 0;
  at::Tensor cos, sin;     // (T, rotary_dim)
  at::Tensor real_tokens;  // (T) bool: not padding (what the router's load-balancing loss counts)
  // Sequence parallelism: how the T tokens split over the tensor-parallel ranks between the layers'
  // regions. cos, sin and cu_seqlens then cover the padded length (the padding a sample of its
  // own), and real_tokens this rank's chunk.
  parallel::SequenceChunks chunks;
  // Context parallelism (text_shard.enabled()): how the layers run over this rank's shard; cos, sin and
  // real_tokens are then the shard's.
  ContextParallelPass context_parallel;
  std::vector<LayerDecoding>* decoding = nullptr;  // a generation pass's layer states
  // The vision tower's rows: the images', then the videos'.
  at::Tensor pixel_values, grid_thw;
  std::vector<int64_t> vision_cu;  // each frame's rows, an attention segment
  at::Tensor vision_cos, vision_sin, position_indices, position_weights;
  bool has_text() const { return input_ids.defined(); }
  bool has_vision() const { return pixel_values.defined(); }
};

// Qwen3.5's M-RoPE positions (3, B, L) (temporal, height, width), as transformers' get_rope_index
// gives them, each row's real tokens (attention_mask 1) or each packed sample on its own: text
// counts up on all three axes; a run of image (or video) tokens takes its grid's next entry (a
// video's temporal patches one by one) and its merged patch (r, c) gets (p, p + r, p + c) for the
// position p it starts at, after which text continues at p + max(rows, columns). Padding gets 0.
at::Tensor rope_position_ids(const VisionLanguageInputs& inputs, const Config& config);

class ForConditionalGeneration : public torch::nn::Module, public VisionLanguageModel {
 public:
  ForConditionalGeneration(const Config& config, const parallel::ParamOptions& options);

  // `cp` (enabled): each rank's layers see its shard of the tokens (text_shard); the vision tower
  // runs whole on every rank.
  // `decoding` (one per language-model layer): a generation pass, the samples the packed row's
  // segments (a prefill) or its tokens (a step; position ids given).
  std::shared_ptr<const Context> context(const VisionLanguageInputs& inputs,
                                         const parallel::ContextParallelGroup* cp = nullptr,
                                         std::vector<LayerDecoding>* decoding = nullptr) const;
  std::shared_ptr<const VisionLanguageContext> sharded_context(
      const VisionLanguageInputs& inputs, const parallel::ContextParallelGroup& cp) const override;
  at::Tensor image_embeddings(const at::Tensor& pixel_values,
                              const at::Tensor& image_grid_thw) const override;
  at::Tensor hidden_states(const VisionLanguageInputs& inputs) const override;
  at::Tensor logits(const at::Tensor& hidden) const override;
  at::Tensor whole_logits(const at::Tensor& hidden) const override;
  int64_t vocab_start() const override { return language_model->embed_tokens->vocab_start(); }
  const at::Tensor& lm_head_weight() const override;
  const parallel::TensorParallelGroup& llm_tp() const override { return tp_; }
  at::Tensor position_ids(const VisionLanguageInputs& inputs) const override;
  // Generation: the prompts' real tokens packed, each a sample; then one token a row, each layer
  // keeping its rows' convolution and recurrent states (linear attention) or keys and values.
  std::unique_ptr<VisionLanguageDecoder> decoder() const override;
  double training_flops(const std::vector<int64_t>& sequence_lengths,
                        const at::Tensor& image_grid_thw) const override;
  std::vector<SpecialToken> special_tokens() const override;
  int64_t vocab_size() const override { return config.text.vocab_size; }
  int64_t hidden_size() const override { return config.text.hidden_size; }
  int64_t max_position_embeddings() const override { return config.max_position_embeddings; }
  int64_t bos_token_id() const override { return config.bos_token_id; }
  int64_t experts() const override { return config.text.num_experts; }
  int64_t routed_layers() const override {
    return config.text.moe() ? static_cast<int64_t>(config.text.layer_types.size()) : 0;
  }
  // Each layer's expert bias (training.moe_expert_bias_rate) moved towards its step's balance.
  void end_step(const at::Tensor& picks) override;

  using torch::nn::Module::to;
  void to(torch::Device device, bool non_blocking = false) override;
  torch::nn::Module& module() override { return *this; }
  core::Layers layers() const override { return layers_; }
  nlohmann::json hf_config() const override;
  std::vector<std::string> freeze_examples() const override;

  Config config;
  std::shared_ptr<torch::nn::Module> model;  // model.visual, model.language_model
  std::shared_ptr<VisionModel> visual;
  std::shared_ptr<TextModel> language_model;
  std::shared_ptr<parallel::ColumnParallelLinear> lm_head;  // null when tied to the embedding

 private:
  core::Layers layers_;
  parallel::TensorParallelGroup tp_;
  at::Device device_ = at::kCPU;
};

}  // namespace loom::models::qwen3_5
