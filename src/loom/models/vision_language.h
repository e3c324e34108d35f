// A vision-language model as tasks and commands see it: a vision encoder, a projector and a language
// model, with the family's rule for where image features enter the token sequence and how positions
// are made. vlm_sft (training, evaluation) and loom chat, generate and forward are written against
// this interface; each family (models/<family>/) implements it.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/core/model.h"
#include "loom/parallel/context/shard.h"
#include "loom/parallel/tensor.h"

namespace loom::models {

struct VisionLanguageInputs {
  at::Tensor input_ids;       // (B, L) int64, each image's block of tokens already expanded
  at::Tensor attention_mask;  // (B, L) int64, 1 for real tokens; undefined = all real
  at::Tensor pixel_values;    // the images' rows as the family's processor makes them; undefined: none
  at::Tensor image_grid_thw;  // (images, 3) int64: each image's grid, as its processor gives it
  // Videos, for families whose processor takes them: their rows and grids as the processor makes
  // them (undefined: none) and each video's seconds per temporal patch (empty: 1.0 each).
  at::Tensor pixel_values_videos;
  at::Tensor video_grid_thw;
  std::vector<double> second_per_grid_ts;
  at::Tensor position_ids;  // the family's position ids; undefined = computed from the above
  // Packed samples: input_ids is one row (B = 1) holding samples [cu[i], cu[i+1]); attention
  // and position ids restart at every sample, as if each ran alone. Empty: one sample per row.
  std::vector<int64_t> cu_seqlens;
};

// What the layers of one micro-batch read, built once before the first layer; a family's context
// derives from it.
struct VisionLanguageContext : core::Context {
  // Context parallelism (text_shard.enabled()): the last layer's hidden states are this rank's
  // tokens of every row as one row; text_shard.scatter gives their labels.
  parallel::ContextShard text_shard;
};

// Incremental decoding: the prompts once, then one token per row per step over a key/value cache.
class VisionLanguageDecoder {
 public:
  virtual ~VisionLanguageDecoder() = default;
  // Left-padded prompts (attention mask 0 on the padding at the start of rows, every row's last
  // token real), images included -> the whole logits of each row's last token (B, vocab). Starts
  // a new cache.
  virtual at::Tensor prefill(const VisionLanguageInputs& prompts) = 0;
  // One token per row (B) after those seen -> their whole logits (B, vocab).
  virtual at::Tensor step(const at::Tensor& tokens) = 0;
};

// A special token the model's config.json names by id, which the tokenizer must give the same id.
struct SpecialToken {
  std::string key;   // the config.json key, e.g. image_token_id
  int64_t id = 0;    // its value there
  std::string text;  // the token, e.g. <|image_pad|>
};

class VisionLanguageModel : public core::Model {
 public:
  // The context of a training pass: under context parallelism (`cp` enabled) each rank's layers see
  // its shard of the tokens (text_shard) and of the vision rows; otherwise the whole micro-batch.
  virtual std::shared_ptr<const VisionLanguageContext> sharded_context(
      const VisionLanguageInputs& inputs, const parallel::ContextParallelGroup& cp) const = 0;
  // The image features as they enter the token sequence: (image tokens, hidden); (0, hidden) without
  // images.
  virtual at::Tensor image_embeddings(const at::Tensor& pixel_values,
                                      const at::Tensor& image_grid_thw) const = 0;
  // Final hidden states (B, L, hidden) after the last norm: every layer, run directly.
  virtual at::Tensor hidden_states(const VisionLanguageInputs& inputs) const = 0;
  // LM head: (..., hidden) -> (..., vocab / tp), this rank's slice of the vocabulary (from
  // vocab_start()); all of it at tp 1. whole_logits() gathers the slices.
  virtual at::Tensor logits(const at::Tensor& hidden) const = 0;
  virtual at::Tensor whole_logits(const at::Tensor& hidden) const = 0;
  virtual int64_t vocab_start() const = 0;
  // The LM head's weight (vocab / tp, hidden): its own, or the embedding's when tied.
  virtual const at::Tensor& lm_head_weight() const = 0;
  virtual const parallel::TensorParallelGroup& llm_tp() const = 0;
  // The position ids the language model gives `inputs` (what a peer implementation is handed).
  virtual at::Tensor position_ids(const VisionLanguageInputs& inputs) const = 0;
  // A decoder over this model, which must outlive it.
  virtual std::unique_ptr<VisionLanguageDecoder> decoder() const = 0;
  // Training FLOPs (forward + backward) for a batch with these sequence lengths and image grids.
  virtual double training_flops(const std::vector<int64_t>& sequence_lengths,
                                const at::Tensor& image_grid_thw) const = 0;

  // The tokens the model's config names by id (checked against a tokenizer before training).
  virtual std::vector<SpecialToken> special_tokens() const = 0;
  virtual int64_t vocab_size() const = 0;               // rows of the embedding, over every rank
  virtual int64_t hidden_size() const = 0;              // the language model's width
  virtual int64_t max_position_embeddings() const = 0;  // the language model's
  virtual int64_t bos_token_id() const = 0;             // for generation_config.json

  at::Tensor forward(const VisionLanguageInputs& inputs) const { return logits(hidden_states(inputs)); }
};

}  // namespace loom::models
