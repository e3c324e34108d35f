// The data a job trains and evaluates on, whatever the dataset: a built-in visual question
// answering set (shapes_vqa, fashion_mnist) or the user's conversation files (messages). Samples
// are addressed by their index in the training stream, so a resumed run sees the same samples.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "loom/config/config.h"
#include "loom/data/example.h"
#include "loom/data/image/processor.h"
#include "loom/data/tokenizer/tokenizer.h"

namespace loom::tasks {

// Training samples [begin, end) of the stream, less those left out, with how many were.
struct TrainSamples {
  std::vector<data::TokenizedExample> examples;
  int64_t truncated = 0, dropped = 0;  // over data.max_seq_len, as data.overlong says
  int64_t skipped = 0;                 // unusable (missing or corrupt image); the data's skip log names them
};

class JobData {
 public:
  virtual ~JobData() = default;
  virtual const data::Tokenizer& tokenizer() const = 0;
  // Puts the tokenizer into a checkpoint directory, in a form load_tokenizer reads back.
  virtual void save_tokenizer(const std::string& dir) const = 0;
  // Whether that file is a tokenizer.json (not a SentencePiece model).
  virtual bool tokenizer_json() const = 0;
  // The model's image processor, as the samples are made with it.
  virtual const data::ImageProcessor& processor() const = 0;
  // The chat template (Jinja, as tokenizer_config.json carries it) that renders a conversation as
  // the samples are.
  virtual std::string chat_template() const = 0;
  // Safe to call from several threads at once.
  virtual TrainSamples train_examples(int64_t begin, int64_t end) const = 0;
  // Held-out samples [begin, end) as generation prompts: answers, questions and question types
  // kept for scoring. eval_samples() may be 0: nothing held out.
  virtual data::Batch eval_prompts(int64_t begin, int64_t end) const = 0;
  // The same samples as training rows (the prompt and the labelled answer), one per row, for the
  // held-out loss; question types kept.
  virtual data::Batch eval_examples(int64_t begin, int64_t end) const = 0;
  virtual int64_t eval_samples() const = 0;
  // Training samples in one epoch of the stream (the mix of the user's files: all their usable
  // samples; a built-in set: its training split); 0 for a generated set.
  virtual int64_t epoch_samples() const = 0;
};

// What the job's data section asks for, its images made by the model's `processor`.
std::unique_ptr<JobData> make_job_data(const config::DataSection& data, uint64_t seed,
                                       std::unique_ptr<data::ImageProcessor> processor);

// The id collated rows are padded with: <|endoftext|>, or <|im_end|> for a tokenizer without it.
// Padding is masked out of attention and loss, so any id the model knows will do.
int64_t padding_id(const data::Tokenizer& tokenizer);

// The tokenizer's end tokens, which stop an answer: <|im_end|>, and <|endoftext|> when it has one.
std::vector<int64_t> stop_ids(const data::Tokenizer& tokenizer);

// Applies data.max_seq_len to a training example as data.overlong says: false when the example is
// dropped; truncates it in place (never inside an image `block`) and counts it; DataError naming
// `what` for overlong: error.
bool fit_to_length(data::TokenizedExample& example, const config::DataSection& data,
                   const data::Tokenizer& tokenizer, const data::ImageBlock& block, const std::string& what,
                   TrainSamples& counts);

}  // namespace loom::tasks
