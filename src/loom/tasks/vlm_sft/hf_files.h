// The files transformers reads beside a Qwen2-VL's weights, written into every checkpoint so it
// opens as a model, a processor and a chat model: preprocessor_config.json (the image processor
// settings the samples were made with), tokenizer_config.json and chat_template.json (the chat
// template the model was trained with, as Jinja) and generation_config.json (the stop tokens).
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "loom/data/image/qwen2vl_processor.h"
#include "loom/data/tokenizer/tokenizer.h"
#include "loom/models/qwen2_vl/config.h"

namespace loom::tasks {

// Qwen2VLImageProcessor's settings, with both the older (min_pixels, max_pixels) and the newer
// (shortest_edge, longest_edge) forms of its size.
nlohmann::ordered_json preprocessor_config(const data::Qwen2VLImageOptions& image);

// Qwen2-VL's ChatML template as Loom applies it (data/chat_template.h): `default_system` when the
// conversation has no system message, each "<image>" of a string content (or each image part of a
// list content) as <|vision_start|><|image_pad|><|vision_end|>.
std::string qwen2vl_chat_template(const std::string& default_system);
// The built-in VQA sets' word-level form of it: no system message, no newlines, the words
// separated by spaces for the WhitespaceSplit tokenizer.
std::string vqa_chat_template();

// tokenizer_config.json: the template, <|im_end|> as the end token, the padding token Loom pads
// with, and (for a tokenizer.json, not a SentencePiece model) the tokenizer class that reads it.
nlohmann::ordered_json tokenizer_config(const data::Tokenizer& tokenizer, bool tokenizer_json,
                                        const std::string& chat_template, int64_t model_max_length);

// generation_config.json from the tokenizer's stop tokens: <|im_end|> and <|endoftext|> when it has
// them.
nlohmann::ordered_json generation_config(const data::Tokenizer& tokenizer,
                                         const models::Qwen2VLConfig& config);

}  // namespace loom::tasks
