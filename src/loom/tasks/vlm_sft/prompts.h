// What loom chat and loom generate read from a model directory to turn a chat into a prompt: its
// tokenizer, its image processor and the prompt format its chat template names.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "loom/data/chat_template.h"
#include "loom/data/example.h"
#include "loom/data/image/processor.h"
#include "loom/data/tokenizer/tokenizer.h"

namespace loom::tasks {

enum class PromptFormat {
  chatml,  // ChatML (data::ChatTemplate), multi-turn, with a default system message
  vqa,     // the built-in VQA sets' word-level form: one question about one image
};

class ChatPrompts {
 public:
  // Reads the directory's tokenizer (tokenizer.json, else one SentencePiece .model) and chat
  // template (chat_template.jinja, chat_template.json, else tokenizer_config.json's), with the
  // model's image `processor` (the directory's settings read into it): Loom's VQA template gives
  // PromptFormat::vqa; a ChatML template (<|im_start|>, the processor's image block) gives
  // PromptFormat::chatml with the template's default system message. DataError naming the file
  // otherwise.
  ChatPrompts(const std::string& dir, std::unique_ptr<data::ImageProcessor> processor);

  const data::Tokenizer& tokenizer() const { return *tokenizer_; }
  PromptFormat format() const { return format_; }
  const std::string& default_system() const { return default_system_; }

  // A chat that ends with a user message (an optional system message first), as a prompt that ends
  // where the assistant's answer begins; `images` are files, one per "<image>" placeholder in order,
  // or, when the messages hold none, placed before the first user message's text. DataError naming
  // `source` for a chat the format cannot take (the VQA format: one user message, one image) or an
  // image that cannot be read.
  data::TokenizedExample prompt(std::vector<data::Message> messages, const std::vector<std::string>& images,
                                const std::string& source) const;

 private:
  std::unique_ptr<data::Tokenizer> tokenizer_;
  std::shared_ptr<data::ImageProcessor> processor_;
  PromptFormat format_ = PromptFormat::chatml;
  std::string default_system_;
  std::unique_ptr<data::ChatTemplate> template_;  // chatml
};

}  // namespace loom::tasks
