#include "loom/tasks/vlm_sft/hf_files.h"

#include <vector>

#include "loom/tasks/vlm_sft/job_data.h"
#include "loom/util/errors.h"

namespace loom::tasks {

nlohmann::ordered_json tokenizer_config(const data::Tokenizer& tokenizer, bool tokenizer_json,
                                        const std::string& chat_template, int64_t model_max_length,
                                        const nlohmann::ordered_json& named_tokens) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  if (tokenizer_json) out["tokenizer_class"] = "PreTrainedTokenizerFast";  // reads tokenizer.json
  out["chat_template"] = chat_template;
  out["eos_token"] = "<|im_end|>";
  // As padding_id chooses.
  out["pad_token"] = stop_ids(tokenizer).size() > 1 ? "<|endoftext|>" : "<|im_end|>";
  out["model_max_length"] = model_max_length;
  out["clean_up_tokenization_spaces"] = false;
  out["split_special_tokens"] = false;
  if (!named_tokens.empty()) out["model_specific_special_tokens"] = named_tokens;
  return out;
}

nlohmann::ordered_json generation_config(const data::Tokenizer& tokenizer, int64_t bos_token_id) {
  return {{"bos_token_id", bos_token_id},
          {"eos_token_id", stop_ids(tokenizer)},
          {"pad_token_id", padding_id(tokenizer)}};
}

}  // namespace loom::tasks
