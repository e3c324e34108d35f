// The built-in visual question answering sets as a job's data (shapes_vqa, fashion_mnist), with
// their word tokenizer.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loom/config/config.h"
#include "loom/data/example.h"
#include "loom/data/tokenizer/word_tokenizer.h"
#include "loom/data/vqa.h"
#include "loom/tasks/vlm_sft/job_data.h"

namespace loom::tasks {

class VqaData : public JobData {
 public:
  // Images are processed whole by the model's `processor` (ImageProcessor::set_square_images) at
  // data.image_size x data.image_size.
  VqaData(const config::DataSection& data, uint64_t seed, std::unique_ptr<data::ImageProcessor> processor);

  const data::WordTokenizer& tokenizer() const override { return tokenizer_; }
  void save_tokenizer(const std::string& dir) const override;
  bool tokenizer_json() const override { return true; }
  const data::ImageProcessor& processor() const override { return *processor_; }
  std::string chat_template() const override;
  const std::vector<std::string>& question_types() const { return question_types_; }

  // A finite training split is walked in a fresh seeded order every epoch.
  TrainSamples train_examples(int64_t begin, int64_t end) const override;
  data::Batch eval_prompts(int64_t begin, int64_t end) const override;
  data::Batch eval_examples(int64_t begin, int64_t end) const override;
  int64_t eval_samples() const override { return eval_samples_; }
  int64_t epoch_samples() const override { return train_size_; }

  // The raw sample at `index`: for training, the index-th of the run (epochs walk the split in
  // seeded orders) with data.hflip and data.shift applied; held-out samples as they are.
  data::VqaSample sample(data::Split split, int64_t index) const;

 private:
  data::TokenizedExample example(data::Split split, int64_t index, bool with_answer) const;

  std::function<data::VqaSample(data::Split, int64_t)> sample_;
  int64_t train_size_ = 0;  // 0: unbounded (generated)
  uint64_t seed_;
  std::vector<std::string> question_types_;
  data::WordTokenizer tokenizer_;
  std::unique_ptr<data::ImageProcessor> processor_;
  int64_t eval_samples_;
  config::DataSection section_;
};

}  // namespace loom::tasks
