// Chat-formatted training examples (tokens, label mask, image patches) and their collation
// into padded batches for the model.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "loom/data/image/processor.h"
#include "loom/data/tokenizer/word_tokenizer.h"
#include "loom/data/vqa.h"

namespace loom::data {

constexpr int64_t kIgnoreIndex = -100;  // label of a token that carries no loss

struct TokenizedExample {
  std::vector<int64_t> input_ids, labels;       // labels aligned with input_ids, kIgnoreIndex = no loss
  std::vector<VisionInput> images;              // in order of their image blocks
  std::vector<VisionInput> videos;              // in order of their video blocks
  std::string question, answer, question_type;  // for evaluation and its report
  int64_t prompt_length = 0;                    // tokens before the answer
};

// Words of the chat template beyond the specials; a word tokenizer for chat data includes them.
const std::vector<std::string>& chat_template_words();  // {"user", "assistant"}

// <|im_start|> user START PAD x N END QUESTION <|im_end|> <|im_start|> assistant [ANSWER <|im_end|>],
// with the processor's image block (START, PAD, END) and N the image's tokens. Labels are the answer
// tokens and the final <|im_end|>; without the answer the example is a generation prompt.
TokenizedExample build_vqa_example(const WordTokenizer& tokenizer, const VqaSample& sample,
                                   const ImageProcessor& processor, bool with_answer);

struct Batch {
  at::Tensor input_ids;            // (B, L) int64, right-padded with pad_id
  at::Tensor labels;               // (B, L) int64, kIgnoreIndex on padding and prompt
  at::Tensor attention_mask;       // (B, L) int64, 1 real token, 0 padding
  at::Tensor pixel_values;         // every image's rows (VisionInput) concatenated, in order of appearance
  at::Tensor image_grid_thw;       // (num_images, 3) int64
  at::Tensor pixel_values_videos;  // every video's rows, in order of appearance; (0, 0) without videos
  at::Tensor video_grid_thw;       // (num_videos, 3) int64
  std::vector<double> second_per_grid_ts;  // each video's seconds per temporal patch
  int64_t num_target_tokens = 0;           // labels that are a next-token target (!= kIgnoreIndex, not first)
  // Packed batches: one row (B = 1) of examples [cu[i], cu[i+1]) back to back, no padding. Empty
  // for a padded batch (one example per row).
  std::vector<int64_t> cu_seqlens;
  std::vector<std::string> questions, answers, question_types;  // one per example

  bool packed() const { return !cu_seqlens.empty(); }
  // Tokens of each example, in order.
  std::vector<int64_t> sequence_lengths() const;
};

// Pads to the longest example; pixel_values holds every image of every example, in order.
Batch collate(const std::vector<TokenizedExample>& examples, int64_t pad_id);

// Packs the examples into one padding-free row with cu_seqlens at their boundaries. Each
// example's first label is cleared: as in a row of its own, its first token is never a target
// (in the packed row it would be the previous example's last prediction), so the packed loss
// is the sum of the examples' own losses.
Batch pack(const std::vector<TokenizedExample>& examples);

}  // namespace loom::data
