// The ChatML chat template applied to a Conversation: token ids with each <image> expanded to the
// block of tokens the model's image processor gives it, and labels on the assistant replies, for any
// Tokenizer.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/data/conversation.h"
#include "loom/data/example.h"
#include "loom/data/image/processor.h"
#include "loom/data/tokenizer/tokenizer.h"

namespace loom::data {

struct ChatTemplateOptions {
  // Used when the conversation has no system message (ChatML's customary one unless the model's
  // processor says otherwise); "": no system message then.
  std::string default_system = "You are a helpful assistant.";
  // Label every token but the image blocks' pads (whose positions hold image features), instead of
  // the assistant replies only.
  bool train_on_prompt = false;
  // Leave out the final assistant message (kept as `answer`) and end with "<|im_start|>assistant\n",
  // as add_generation_prompt does; no token is labelled.
  bool generation_prompt = false;
  // The model's image processor: what an image becomes and the tokens of its block. Null: text-only
  // chats (an <image> placeholder is a DataError).
  std::shared_ptr<const ImageProcessor> processor;
  // A video's frames: taken video_fps a second (a frame list: the rate it was taken at), at most
  // video_max_frames of them (read_video_frames).
  double video_fps = 2.0;
  int64_t video_max_frames = 128;
};

struct ConversationExample {
  std::vector<int64_t> input_ids, labels;  // labels aligned with input_ids, kIgnoreIndex = no loss
  std::vector<VisionInput> images;         // one per <image>, in order of appearance
  std::vector<VisionInput> videos;         // one per <video>, in order of appearance
  std::string answer;                      // the final assistant message
  int64_t prompt_length = 0;               // tokens before the final assistant message's content
  std::string source;                      // dataset file and sample, for messages
  int64_t sample_index = -1;

  // Token length of the templated sample (what packing and length limits look at).
  int64_t length() const { return static_cast<int64_t>(input_ids.size()); }
  TokenizedExample to_tokenized_example() const;
};

// The text, following the ChatML chat_template.json the vision-language checkpoints ship:
//   {% for message in messages %}{% if loop.first and message['role'] != 'system' %}
//   <|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}
//   <|im_start|>{{ message['role'] }}\n ... {{ content }}<|im_end|>\n{% endfor %}
//   {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}
// where an image is its processor's block (chatml_template_jinja): start, the image's `tokens` pads,
// end. Special tokens are emitted as ids; the text between
// them is encoded piece by piece, so no merge crosses a special token. As in LLaMA-Factory's and
// MindSpeed MM's ChatML templates, a user turn is encoded together with the following
// "<|im_start|>assistant\n" as the prompt, and each reply "{content}<|im_end|>\n" separately as the
// response: the reply's content, its <|im_end|> and the "\n" after it are labelled, every assistant
// turn of a multi-turn conversation included. A conversation's tools (Conversation::tools) follow the
// system message's text inside its turn, the default system message's when it gives none.
class ChatTemplate {
 public:
  // Keeps a reference to the tokenizer, which must outlive the template. DataError when the
  // tokenizer lacks <|im_start|>, <|im_end|> or a token of the processor's image block.
  explicit ChatTemplate(const Tokenizer& tokenizer, ChatTemplateOptions options = {});

  // The conversation with its images and videos already processed (one VisionInput each, in order).
  // DataError naming the sample when conversation_problem() finds one or a count differs.
  ConversationExample apply(const Conversation& conversation, std::vector<VisionInput> images,
                            std::vector<VisionInput> videos = {}) const;

  // Decodes and processes the conversation's images and videos, then applies the template. A missing
  // image or video file (or frame), one that fails to decode or process, or a conversation_problem()
  // is recorded in skips and gives nullopt. DataError when the conversation has videos and the
  // model's processor takes none. Safe to call from several threads at once if the tokenizer is.
  std::optional<ConversationExample> build(const Conversation& conversation, SkipLog& skips) const;

  // A text-only chat as a model's prompt (inference, `loom data tokenize --chat`): every message as
  // it is, the last one a user or an assistant message, then "<|im_start|>assistant\n" when
  // add_generation_prompt; nothing is labelled, whatever the options say. With a tokenizer that splits
  // its input at special tokens (as byte-level BPE ones do), these are the ids of the whole template text.
  // DataError, for the caller to prefix with the chat's source, when chat_problem() finds one or a
  // message has an "<image>" placeholder.
  std::vector<int64_t> encode_chat(const std::vector<Message>& messages, bool add_generation_prompt) const;

  const ChatTemplateOptions& options() const { return options_; }

 private:
  // The template of messages[0, end) with the images of their placeholders and `tools` after the
  // system message (Conversation::tools), then the generation prompt when asked; replies labelled when
  // `labelled` (train_on_prompt then labels the prompt too).
  ConversationExample render(const std::vector<Message>& messages, size_t end, const std::string& tools,
                             const std::vector<VisionInput>& images, const std::vector<VisionInput>& videos,
                             bool generation_prompt, bool labelled) const;

  const Tokenizer* tokenizer_;
  ChatTemplateOptions options_;
  int64_t im_start_, im_end_;
  int64_t block_start_ = -1, block_end_ = -1, block_pad_ = -1;  // -1: no processor
  int64_t video_pad_ = -1;                                      // -1: no videos
};

// The Jinja of the template as a checkpoint carries it (tokenizer_config.json, chat_template.json):
// `default_system` when the conversation has no system message, each "<image>" of a string content
// (or each image part of a list content) as the block's template_text(). DataError for a default
// system message holding what opens a Jinja tag ({{, {% or {#).
std::string chatml_template_jinja(const std::string& default_system, const ImageBlock& block);
// The built-in VQA sets' word-level form of it: no system message, no newlines, the words separated
// by spaces for the WhitespaceSplit tokenizer.
std::string vqa_template_jinja(const ImageBlock& block);

}  // namespace loom::data
