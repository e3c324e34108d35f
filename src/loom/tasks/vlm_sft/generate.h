// Answers to prompts from a vision-language model, decoded with its key/value cache: greedy or
// sampled (temperature, top-k, top-p), batched with left padding, stopped at the tokenizer's end
// tokens or after max_new_tokens. loom chat, loom generate and the task's evaluation all use it.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "loom/data/example.h"
#include "loom/data/tokenizer/tokenizer.h"
#include "loom/models/vision_language.h"

namespace loom::tasks {

struct SamplingOptions {
  int64_t max_new_tokens = 64;  // >= 1
  double temperature = 0.0;     // 0: greedy (the most likely token); > 0: sampled
  int64_t top_k = 0;            // sampled from the k most likely tokens; 0: all of them
  double top_p = 1.0;           // ... and of those, the fewest whose probabilities reach top_p
  uint64_t seed = 0;            // row r's draw at step t depends on (seed, first_row + r, t) only
  uint64_t first_row = 0;       // the first row's index among all prompts (loom generate's batches)
};

// ConfigError naming the option (as loom chat and generate spell it) for a value out of range.
void check_sampling(const SamplingOptions& options);

// The next token of each row from its logits (B, vocab) at step `step`.
std::vector<int64_t> pick_tokens(const at::Tensor& logits, const SamplingOptions& options, int64_t step);

// The tokens generation needs to know: what pads the prompts, what stops an answer, and how many ids
// the tokenizer has (a model's vocabulary is often padded past them; those ids are never chosen).
struct GenerationTokens {
  int64_t pad = 0;
  std::vector<int64_t> stops;
  int64_t vocab = 0;  // 0: every id of the model
};

// The tokenizer's: its padding_id, stop_ids and vocab_size.
GenerationTokens generation_tokens(const data::Tokenizer& tokenizer);

struct Generated {
  std::vector<std::vector<int64_t>> tokens;  // per row, the stop token left out
  std::vector<bool> finished;                // ended with a stop token (not cut at max_new_tokens)
};

// The answers to a batch of prompts (as data::collate pads them, on the right; moved to the left
// here, padded with tokens.pad). on_token(row, token), when given, sees each chosen token as it is chosen,
// stop tokens not. Every rank of a tensor-parallel group calls it with the same prompts and gets the same
// answers.
Generated generate(const models::VisionLanguageModel& model, const data::Batch& prompts,
                   const GenerationTokens& tokens, const SamplingOptions& options,
                   const std::function<void(int64_t row, int64_t token)>& on_token = {});

// Right-padded rows moved to the left: each row's real tokens end at the last column, the padding
// (pad_id, mask 0) before them.
models::VisionLanguageInputs left_padded(const data::Batch& batch, int64_t pad_id);

}  // namespace loom::tasks
