#include "loom/tasks/vlm_sft/hf_files.h"

#include <vector>

#include "loom/tasks/vlm_sft/job_data.h"
#include "loom/util/errors.h"

namespace loom::tasks {

namespace {

constexpr const char* kImage = "<|vision_start|><|image_pad|><|vision_end|>";

// Jinja for the content of `message`: a string whose "<image>" placeholders become `image`, or a
// list of text and image parts; `separator` goes around each image.
std::string content(const std::string& image, const std::string& separator) {
  return "{% if message['content'] is string %}{{ message['content'] | replace('<image>', '" + separator +
         image + separator +
         "') }}{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' or 'image' in "
         "part "
         "or 'image_url' in part %}" +
         separator + image + separator +
         "{% elif 'text' in part %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}";
}

}  // namespace

nlohmann::ordered_json preprocessor_config(const data::Qwen2VLImageOptions& image) {
  return {{"image_processor_type", "Qwen2VLImageProcessor"},
          {"processor_class", "Qwen2VLProcessor"},
          {"do_convert_rgb", true},
          {"do_resize", true},
          {"resample", 3},  // bicubic
          {"do_rescale", true},
          {"rescale_factor", 1.0 / 255.0},
          {"do_normalize", true},
          {"image_mean", image.mean},
          {"image_std", image.std},
          {"min_pixels", image.min_pixels},
          {"max_pixels", image.max_pixels},
          {"size",
           {{"min_pixels", image.min_pixels},
            {"max_pixels", image.max_pixels},
            {"shortest_edge", image.min_pixels},
            {"longest_edge", image.max_pixels}}},
          {"patch_size", image.patch_size},
          {"temporal_patch_size", image.temporal_patch_size},
          {"merge_size", image.merge_size}};
}

std::string qwen2vl_chat_template(const std::string& default_system) {
  if (default_system.find("{") != std::string::npos || default_system.find("'") != std::string::npos)
    throw DataError("the default system message cannot hold '{' or a quote in a chat template");
  return "{% for message in messages %}{% if loop.first and message['role'] != 'system' "
         "%}<|im_start|>system\n" +
         default_system + "<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n" + content(kImage, "") +
         "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
}

std::string vqa_chat_template() {
  return "{% for message in messages %}<|im_start|>{{ message['role'] }} " + content(kImage, " ") +
         " <|im_end|>{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant {% endif %}";
}

nlohmann::ordered_json tokenizer_config(const data::Tokenizer& tokenizer, bool tokenizer_json,
                                        const std::string& chat_template, int64_t model_max_length) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  if (tokenizer_json) out["tokenizer_class"] = "PreTrainedTokenizerFast";  // reads tokenizer.json
  out["chat_template"] = chat_template;
  out["eos_token"] = "<|im_end|>";
  // As padding_id chooses.
  out["pad_token"] = stop_ids(tokenizer).size() > 1 ? "<|endoftext|>" : "<|im_end|>";
  out["model_max_length"] = model_max_length;
  out["clean_up_tokenization_spaces"] = false;
  out["split_special_tokens"] = false;
  return out;
}

nlohmann::ordered_json generation_config(const data::Tokenizer& tokenizer,
                                         const models::Qwen2VLConfig& config) {
  return {{"bos_token_id", config.tokens.bos},
          {"eos_token_id", stop_ids(tokenizer)},
          {"pad_token_id", padding_id(tokenizer)}};
}

}  // namespace loom::tasks
