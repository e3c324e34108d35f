#include "loom/tasks/vlm_sft/job_data.h"

#include "loom/data/batching.h"
#include "loom/tasks/vlm_sft/messages_data.h"
#include "loom/tasks/vlm_sft/vqa_data.h"
#include "loom/util/errors.h"

namespace loom::tasks {

std::unique_ptr<JobData> make_job_data(const config::DataSection& data, uint64_t seed,
                                       std::unique_ptr<data::ImageProcessor> processor) {
  if (data.dataset == "messages") return std::make_unique<MessagesData>(data, seed, std::move(processor));
  return std::make_unique<VqaData>(data, seed, std::move(processor));
}

int64_t padding_id(const data::Tokenizer& tokenizer) {
  try {
    return tokenizer.id("<|endoftext|>");
  } catch (const DataError&) {
    return tokenizer.id("<|im_end|>");
  }
}

std::vector<int64_t> stop_ids(const data::Tokenizer& tokenizer) {
  std::vector<int64_t> ids{tokenizer.id("<|im_end|>")};
  try {
    ids.push_back(tokenizer.id("<|endoftext|>"));
  } catch (const DataError&) {
  }
  return ids;
}

bool fit_to_length(data::TokenizedExample& example, const config::DataSection& data,
                   const data::Tokenizer& tokenizer, const data::ImageBlock& block, const std::string& what,
                   TrainSamples& counts) {
  const int64_t length = static_cast<int64_t>(example.input_ids.size());
  if (length <= data.max_seq_len) return true;
  if (data.overlong == "error")
    throw DataError(fmt::format("{} has {} tokens, more than data.max_seq_len {} (data.overlong: error)",
                                what, length, data.max_seq_len));
  if (data.overlong == "drop") {
    ++counts.dropped;
    return false;
  }
  data::truncate_example(example, data.max_seq_len, tokenizer.id(block.start), tokenizer.id(block.end),
                         block.video_pad.empty() ? -1 : tokenizer.id(block.video_pad));
  ++counts.truncated;
  return true;
}

}  // namespace loom::tasks
