// The files transformers reads beside a vision-language model's weights, written into every
// checkpoint so it opens as a model, a processor and a chat model: tokenizer_config.json (the chat
// template the model was trained with, as Jinja) and generation_config.json (the stop tokens); the
// image processor's preprocessor_config.json is its own (data::ImageProcessor).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "loom/data/tokenizer/tokenizer.h"

namespace loom::tasks {

// tokenizer_config.json: the template, <|im_end|> as the end token, the padding token Loom pads
// with, the tokens the family's processor looks up by name (data::ImageProcessor::named_tokens), and
// (for a tokenizer.json, not a SentencePiece model) the tokenizer class that reads it.
nlohmann::ordered_json tokenizer_config(const data::Tokenizer& tokenizer, bool tokenizer_json,
                                        const std::string& chat_template, int64_t model_max_length,
                                        const nlohmann::ordered_json& named_tokens);

// generation_config.json from the model's beginning-of-text id and the tokenizer's stop tokens:
// <|im_end|> and <|endoftext|> when it has them.
nlohmann::ordered_json generation_config(const data::Tokenizer& tokenizer, int64_t bos_token_id);

}  // namespace loom::tasks
