// The training and evaluation data of a job: the built-in visual question answering sets
// (shapes_vqa, fashion_mnist), their tokenizer, and batches addressed by a global index so a
// resumed run sees the same samples.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loom/config/config.h"
#include "loom/data/example.h"
#include "loom/data/tokenizer/word_tokenizer.h"
#include "loom/data/vqa.h"

namespace loom::train {

class VqaData {
 public:
  // `image` gives the model's patch geometry (patch, temporal patch and merge sizes); images are
  // processed at data.image_size x data.image_size, which must be a multiple of patch x merge.
  VqaData(const config::DataSection& data, uint64_t seed, const data::Qwen2VLImageOptions& image = {});

  const data::WordTokenizer& tokenizer() const { return tokenizer_; }
  const std::vector<std::string>& question_types() const { return question_types_; }

  // Samples [begin, end) of the training stream, with answers. A finite training split is walked
  // in a fresh seeded order every epoch.
  std::vector<data::TokenizedExample> train_examples(int64_t begin, int64_t end) const;
  // Held-out samples [begin, end) as generation prompts (answers kept for scoring).
  data::Batch eval_prompts(int64_t begin, int64_t end) const;
  int64_t eval_samples() const { return eval_samples_; }

 private:
  data::TokenizedExample example(data::Split split, int64_t index, bool with_answer) const;

  std::function<data::VqaSample(data::Split, int64_t)> sample_;
  int64_t train_size_ = 0;  // 0: unbounded (generated)
  uint64_t seed_;
  std::vector<std::string> question_types_;
  data::WordTokenizer tokenizer_;
  data::Qwen2VLImageOptions image_options_;
  int64_t eval_samples_;
  int64_t max_seq_len_;
};

}  // namespace loom::train
