// The user's conversation files as a job's data (dataset: messages): a weighted mix of JSON /
// JSON-lines files read with the configured field names, tokenized with a HuggingFace or
// SentencePiece tokenizer through the ChatML chat template, images decoded and processed by the
// model's image processor. Unusable samples are skipped, counted and named in warnings.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "loom/config/config.h"
#include "loom/data/chat_template.h"
#include "loom/data/conversation.h"
#include "loom/tasks/vlm_sft/job_data.h"

namespace loom::tasks {

class MessagesData : public JobData {
 public:
  // Reads every training and held-out file now. Bad training samples are skipped and counted; a
  // held-out sample that cannot be used (malformed, placeholders not matching its images, an image
  // missing or not decoding, a prompt over data.max_seq_len) is a DataError naming its file and
  // index. The evaluation takes the first data.eval_samples of them (all when they are fewer).
  // Images are processed by the model's `processor`, within data.min_pixels and data.max_pixels when
  // given.
  MessagesData(const config::DataSection& data, uint64_t seed,
               std::unique_ptr<data::ImageProcessor> processor);

  const data::Tokenizer& tokenizer() const override { return *tokenizer_; }
  // Copies the tokenizer file into the directory under the name transformers reads: tokenizer.json,
  // or tokenizer.model for a SentencePiece model.
  void save_tokenizer(const std::string& dir) const override;
  bool tokenizer_json() const override;
  const data::ImageProcessor& processor() const override { return *processor_; }
  std::string chat_template() const override;
  // Skipped samples (missing or corrupt images) are left out and counted in `skipped`.
  TrainSamples train_examples(int64_t begin, int64_t end) const override;
  // The question is the last user message and the question type the sample's file name, so
  // accuracy is reported per held-out file. DataError naming the sample for an unusable one.
  data::Batch eval_prompts(int64_t begin, int64_t end) const override;
  data::Batch eval_examples(int64_t begin, int64_t end) const override;
  int64_t eval_samples() const override { return eval_samples_; }
  int64_t epoch_samples() const override;

 private:
  // One held-out conversation as a generation prompt, or (with_replies) as a training row with its
  // labelled replies, from its already processed `images` and `videos` when given (else decoded);
  // DataError naming it when it cannot be used or is over data.max_seq_len.
  data::TokenizedExample held_out(const data::Conversation& conversation, bool with_replies,
                                  std::vector<data::VisionInput> images = {},
                                  std::vector<data::VisionInput> videos = {}) const;
  // DataError for the first problem recorded, if any.
  static void throw_if_unusable(const data::SkipLog& problems);

  config::DataSection section_;
  std::string tokenizer_path_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  mutable data::SkipLog skips_;  // thread-safe; recording a skip does not change the data
  std::unique_ptr<data::ConversationMix> train_;
  std::vector<data::Conversation> eval_;
  int64_t eval_samples_ = 0;
  std::shared_ptr<data::ImageProcessor> processor_;
  std::unique_ptr<data::ChatTemplate> template_, prompt_template_;
  int64_t pad_id_ = 0;
};

}  // namespace loom::tasks
