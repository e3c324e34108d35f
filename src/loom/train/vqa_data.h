// The training and evaluation data of a job: the built-in visual question answering sets, their
// tokenizer, and batches addressed by a global index so a resumed run sees the same samples.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "loom/config/config.h"
#include "loom/data/example.h"
#include "loom/data/synth/shapes_vqa.h"
#include "loom/data/tokenizer/word_tokenizer.h"

namespace loom::train {

class VqaData {
 public:
  VqaData(const config::DataSection& data, uint64_t seed);

  const data::WordTokenizer& tokenizer() const { return tokenizer_; }
  const std::vector<std::string>& question_types() const;

  // Micro-batch `index` of the training stream: samples [index*size, (index+1)*size).
  data::Batch train_batch(int64_t index, int64_t size) const;
  // Held-out samples [begin, end) as generation prompts (answers kept for scoring).
  data::Batch eval_prompts(int64_t begin, int64_t end) const;
  int64_t eval_samples() const { return eval_samples_; }

 private:
  data::ShapesVqa dataset_;
  data::WordTokenizer tokenizer_;
  data::Qwen2VLImageOptions image_options_;
  int64_t eval_samples_;
};

}  // namespace loom::train
