// Qwen2-VL / Qwen2.5-VL for conditional generation: vision tower + Qwen2 LLM + LM head, with
// HuggingFace parameter names (visual.*, model.*, lm_head.*).
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/model.h"
#include "loom/models/qwen2_vl/config.h"
#include "loom/models/qwen2_vl/layers.h"
#include "loom/models/qwen2_vl/vision.h"
#include "loom/models/text/decoder.h"
#include "loom/models/vision_language.h"

namespace loom::models {

// Qwen2-VL's VisionLanguageInputs: pixel_values (patches, C*T*P*P), image_grid_thw (gt, gh, gw) in
// patches before merging, position_ids (3, B, L) M-RoPE ids.

struct RopeIndex {
  at::Tensor position_ids;  // (3, B, L) int64
  at::Tensor rope_deltas;   // (B, 1) int64: max position + 1 - sequence length
};

// M-RoPE position ids: text runs count up on all three axes; an image or video block starting at s
// takes (s + t, s + row, s + col) over its merged grid (blocks in text order, each kind taking its
// own grids in order); text after it continues at max + 1. The temporal index t of a video's patch
// k is k for Qwen2-VL, and k x second_per_grid_ts x tokens_per_second for Qwen2.5-VL (1.0 seconds a
// patch when second_per_grid_ts is empty; images 0), as transformers computes it. Padding
// (attention_mask 0) gets position 1. With cu_seqlens (a single packed row), positions start again
// at 0 for every sample, and rope_deltas is the last sample's.
RopeIndex rope_index(const VisionLanguageInputs& inputs, const Qwen2VLConfig& config);
// The same for images only.
RopeIndex rope_index(const at::Tensor& input_ids, const at::Tensor& image_grid_thw,
                     const at::Tensor& attention_mask, const Qwen2VLConfig& config,
                     const std::vector<int64_t>& cu_seqlens = {});

class Qwen2VLForConditionalGeneration : public torch::nn::Module, public VisionLanguageModel {
 public:
  // The vision tower is split over `vision_tp` when given, otherwise over options.tp like the LLM.
  Qwen2VLForConditionalGeneration(
      const Qwen2VLConfig& config, const parallel::ParamOptions& options,
      const std::optional<parallel::TensorParallelGroup>& vision_tp = std::nullopt);

  // The context the layers read for `inputs` (layers.h), decoding over `cache` when given.
  std::shared_ptr<const Qwen2VLContext> context(const VisionLanguageInputs& inputs,
                                                KVCache* cache = nullptr) const;
  // The context of a training pass: under context parallelism (`cp` enabled) each rank's layers see
  // its shard of the vision rows and of the text tokens, and the last layer's hidden states are
  // this rank's tokens (the context's text_shard.scatter gives their labels); otherwise context(inputs).
  std::shared_ptr<const VisionLanguageContext> sharded_context(
      const VisionLanguageInputs& inputs, const parallel::ContextParallelGroup& cp) const override;
  // Vision embeddings after the merger: (patches/4, hidden); (0, hidden) without patches.
  at::Tensor image_embeddings(const at::Tensor& pixel_values,
                              const at::Tensor& image_grid_thw) const override;
  at::Tensor hidden_states(const VisionLanguageInputs& inputs) const override;
  at::Tensor logits(const at::Tensor& hidden) const override;
  at::Tensor whole_logits(const at::Tensor& hidden) const override;
  int64_t vocab_start() const override { return model->embed_tokens->vocab_start(); }
  const at::Tensor& lm_head_weight() const override { return head_weight(*model, lm_head.get()); }
  const parallel::TensorParallelGroup& llm_tp() const override { return model->tp; }
  // M-RoPE's (rope_index), unless the inputs give them.
  at::Tensor position_ids(const VisionLanguageInputs& inputs) const override;
  std::unique_ptr<VisionLanguageDecoder> decoder() const override;
  double training_flops(const std::vector<int64_t>& sequence_lengths,
                        const at::Tensor& image_grid_thw) const override;
  // image, video, vision start and end tokens.
  std::vector<SpecialToken> special_tokens() const override;
  int64_t vocab_size() const override { return config.text.vocab_size; }
  int64_t hidden_size() const override { return config.text.hidden_size; }
  int64_t max_position_embeddings() const override { return config.text.max_position_embeddings; }
  int64_t bos_token_id() const override { return config.tokens.bos; }

  // Moves the weights to `device`; the contexts made after it hold their tensors there.
  using torch::nn::Module::to;
  void to(torch::Device device, bool non_blocking = false) override;
  const at::Device& device() const { return device_; }

  // core::Model: the layers are those of layers.h.
  torch::nn::Module& module() override { return *this; }
  core::Layers layers() const override { return layers_; }
  // config.json, its torch_dtype the dtype the weights are held in.
  nlohmann::json hf_config() const override;
  std::vector<std::string> freeze_examples() const override;

  std::shared_ptr<VisionTransformer> visual;
  std::shared_ptr<TextModel> model;
  std::shared_ptr<parallel::ColumnParallelLinear> lm_head;  // null when tied to embed_tokens
  Qwen2VLConfig config;

 private:
  core::Layers layers_;
  at::Device device_ = at::kCPU;
};

}  // namespace loom::models
