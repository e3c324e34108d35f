// The ChatML template: special tokens as ids, text encoded between them, labels on replies.
#include "loom/data/chat_template.h"

#include <filesystem>

#include "loom/data/image/decode.h"
#include "loom/data/video/video_frames.h"
#include "loom/util/errors.h"

namespace loom::data {
namespace {

// Appends to an example: text accumulates until the next special token or turn boundary and is
// then encoded as one piece; a token is labelled when it is in a reply (and label_replies) or
// train_on_prompt holds, except an image block's pads.
class TokenWriter {
 public:
  TokenWriter(const Tokenizer& tokenizer, int64_t image_pad, int64_t video_pad, bool label_replies,
              bool train_on_prompt, ConversationExample& out)
      : tokenizer_(tokenizer),
        image_pad_(image_pad),
        video_pad_(video_pad),
        label_replies_(label_replies),
        train_on_prompt_(train_on_prompt),
        out_(out) {}

  void text(const std::string& text) { pending_ += text; }
  void special(int64_t id) {
    flush();
    push(id);
  }
  void set_response(bool response) {
    flush();
    response_ = response;
  }
  int64_t size() {
    flush();
    return static_cast<int64_t>(out_.input_ids.size());
  }
  void flush() {
    if (pending_.empty()) return;
    for (int64_t id : tokenizer_.encode(pending_)) push(id);
    pending_.clear();
  }

 private:
  void push(int64_t id) {
    out_.input_ids.push_back(id);
    const bool labelled =
        ((response_ && label_replies_) || train_on_prompt_) && id != image_pad_ && id != video_pad_;
    out_.labels.push_back(labelled ? id : kIgnoreIndex);
  }

  const Tokenizer& tokenizer_;
  int64_t image_pad_, video_pad_;
  bool label_replies_, train_on_prompt_, response_ = false;
  ConversationExample& out_;
  std::string pending_;
};

int64_t special_id(const Tokenizer& tokenizer, const std::string& token) {
  try {
    return tokenizer.id(token);
  } catch (const DataError& e) {
    throw DataError(fmt::format("the ChatML chat template needs the special token {} in the tokenizer: {}",
                                token, e.what()));
  }
}

}  // namespace

TokenizedExample ConversationExample::to_tokenized_example() const {
  TokenizedExample out;
  out.input_ids = input_ids;
  out.labels = labels;
  out.images = images;
  out.videos = videos;
  out.answer = answer;
  out.prompt_length = prompt_length;
  return out;
}

ChatTemplate::ChatTemplate(const Tokenizer& tokenizer, ChatTemplateOptions options)
    : tokenizer_(&tokenizer),
      options_(std::move(options)),
      im_start_(special_id(tokenizer, "<|im_start|>")),
      im_end_(special_id(tokenizer, "<|im_end|>")) {
  if (!options_.processor) return;
  const ImageBlock& block = options_.processor->block();
  block_start_ = special_id(tokenizer, block.start);
  block_end_ = special_id(tokenizer, block.end);
  block_pad_ = special_id(tokenizer, block.pad);
  if (!block.video_pad.empty()) video_pad_ = special_id(tokenizer, block.video_pad);
}

ConversationExample ChatTemplate::apply(const Conversation& conversation, std::vector<VisionInput> images,
                                        std::vector<VisionInput> videos) const {
  if (const std::string problem = conversation_problem(conversation); !problem.empty()) {
    throw DataError(fmt::format("{} sample {}: {}", conversation.source, conversation.index, problem));
  }
  if (images.size() != conversation.images.size()) {
    throw DataError(fmt::format("{} sample {}: {} processed images given for {} image paths",
                                conversation.source, conversation.index, images.size(),
                                conversation.images.size()));
  }
  if (videos.size() != conversation.videos.size())
    throw DataError(fmt::format("{} sample {}: {} processed videos given for {} videos", conversation.source,
                                conversation.index, videos.size(), conversation.videos.size()));
  const std::vector<Message>& messages = conversation.messages;
  // A generation prompt leaves out the final reply and labels nothing.
  const bool prompt_only = options_.generation_prompt;
  ConversationExample ex = render(messages, prompt_only ? messages.size() - 1 : messages.size(),
                                  conversation.tools, images, videos, prompt_only, !prompt_only);
  ex.source = conversation.source;
  ex.sample_index = conversation.index;
  ex.answer = messages.back().content;
  ex.images = std::move(images);
  ex.videos = std::move(videos);
  return ex;
}

std::vector<int64_t> ChatTemplate::encode_chat(const std::vector<Message>& messages,
                                               bool add_generation_prompt) const {
  if (const std::string problem = chat_problem(messages); !problem.empty()) throw DataError(problem);
  for (size_t m = 0; m < messages.size(); ++m) {
    if (count_image_placeholders(messages[m].content) > 0) {
      throw DataError(fmt::format("message {} has an {} placeholder, which a text-only chat cannot expand", m,
                                  kImagePlaceholder));
    }
    if (count_video_placeholders(messages[m].content) > 0) {
      throw DataError(fmt::format("message {} has a {} placeholder, which a text-only chat cannot expand", m,
                                  kVideoPlaceholder));
    }
  }
  return render(messages, messages.size(), "", {}, {}, add_generation_prompt, /*labelled=*/false).input_ids;
}

ConversationExample ChatTemplate::render(const std::vector<Message>& messages, size_t end,
                                         const std::string& tools, const std::vector<VisionInput>& images,
                                         const std::vector<VisionInput>& videos, bool generation_prompt,
                                         bool labelled) const {
  ConversationExample ex;
  TokenWriter out(*tokenizer_, block_pad_, video_pad_, labelled, options_.train_on_prompt && labelled, ex);

  // The conversation's system message, else the default one, then its tools; none when that is empty.
  const bool given = messages[0].role == Role::system;
  const size_t first = given ? 1 : 0;
  const std::string system = (given ? messages[0].content : options_.default_system) + tools;
  if (given || !system.empty()) {
    out.special(im_start_);
    out.text("system\n" + system);
    out.special(im_end_);
    out.text("\n");
  }

  const std::string image_placeholder = kImagePlaceholder, video_placeholder = kVideoPlaceholder;
  size_t image = 0, video = 0;
  for (size_t m = first; m < end; ++m) {
    const std::string& content = messages[m].content;
    if (messages[m].role == Role::user) {
      out.special(im_start_);
      out.text("user\n");
      size_t from = 0;
      // Each placeholder in turn, images and videos taking their own in order.
      for (;;) {
        const size_t at_image = content.find(image_placeholder, from);
        const size_t at_video = video_pad_ >= 0 ? content.find(video_placeholder, from) : std::string::npos;
        const size_t at = std::min(at_image, at_video);
        if (at == std::string::npos) break;
        const bool is_video = at == at_video;
        out.text(content.substr(from, at - from));
        if (!options_.processor) throw DataError("an image placeholder in a chat without an image processor");
        const VisionInput& item = is_video ? videos.at(video++) : images.at(image++);
        if (is_video && options_.processor->block().video_timestamps) {
          // Each temporal patch after its time, a block of its own.
          const int64_t patches = item.grid_thw[0];
          if (static_cast<int64_t>(item.timestamps.size()) != patches || patches < 1 ||
              item.tokens % patches != 0)
            throw DataError(fmt::format("a video of {} temporal patches comes with {} timestamps", patches,
                                        item.timestamps.size()));
          for (int64_t t = 0; t < patches; ++t) {
            out.text(fmt::format("<{:.1f} seconds>", item.timestamps[t]));
            out.special(block_start_);
            for (int64_t i = 0; i < item.tokens / patches; ++i) out.special(video_pad_);
            out.special(block_end_);
          }
        } else {
          out.special(block_start_);
          for (int64_t t = 0; t < item.tokens; ++t) out.special(is_video ? video_pad_ : block_pad_);
          out.special(block_end_);
        }
        from = at + (is_video ? video_placeholder : image_placeholder).size();
      }
      out.text(content.substr(from));
      out.special(im_end_);
      out.text("\n");
    } else {
      out.special(im_start_);
      out.text("assistant\n");
      if (m + 1 == end) ex.prompt_length = out.size();
      out.set_response(true);
      out.text(content);
      out.special(im_end_);
      out.text("\n");
      out.set_response(false);
    }
  }
  if (generation_prompt) {
    out.special(im_start_);
    out.text("assistant\n");
    ex.prompt_length = out.size();
  }
  out.flush();
  return ex;
}

std::optional<ConversationExample> ChatTemplate::build(const Conversation& conversation,
                                                       SkipLog& skips) const {
  if (std::string problem = conversation_problem(conversation); !problem.empty()) {
    skips.record({SkipKind::bad_sample, conversation.source, conversation.index, std::move(problem)});
    return std::nullopt;
  }
  std::vector<VisionInput> images;
  for (const std::string& path : conversation.images) {
    std::error_code error;
    if (!std::filesystem::exists(path, error)) {
      skips.record({SkipKind::missing_image, conversation.source, conversation.index,
                    fmt::format("image file {} does not exist", path)});
      return std::nullopt;
    }
    if (!options_.processor) throw DataError("a conversation with images needs the model's image processor");
    try {
      images.push_back(options_.processor->process(decode_image_file(path)));
    } catch (const DataError& e) {
      skips.record({SkipKind::corrupt_image, conversation.source, conversation.index, e.what()});
      return std::nullopt;
    }
  }
  std::vector<VisionInput> videos;
  for (const VideoSource& video : conversation.videos) {
    if (!options_.processor || !options_.processor->takes_videos())
      throw DataError(fmt::format("{} sample {} has a video, and this model's processor takes none",
                                  conversation.source, conversation.index));
    std::vector<std::string> files = video.frames;
    if (!video.file.empty()) files = {video.file};
    for (const std::string& path : files) {
      std::error_code error;
      if (!std::filesystem::exists(path, error)) {
        skips.record(
            {SkipKind::missing_video, conversation.source, conversation.index,
             fmt::format("video {} {} does not exist", video.file.empty() ? "frame" : "file", path)});
        return std::nullopt;
      }
    }
    try {
      const VideoFrames frames = read_video_frames(video, options_.video_fps, options_.video_max_frames);
      videos.push_back(options_.processor->process_video(frames.frames, frames.fps));
    } catch (const DataError& e) {
      skips.record({SkipKind::corrupt_video, conversation.source, conversation.index, e.what()});
      return std::nullopt;
    }
  }
  return apply(conversation, std::move(images), std::move(videos));
}

namespace {

// Jinja for the content of `message`: a string whose "<image>" (and, when `video` is given,
// "<video>") placeholders become `image` (`video`), or a list of text, image and video parts;
// `separator` goes around each image.
std::string content_jinja(const std::string& image, const std::string& separator,
                          const std::string& video = "") {
  const std::string videos = video.empty() ? "" : " | replace('<video>', '" + video + "')";
  const std::string video_part =
      video.empty() ? "" : "{% elif part['type'] == 'video' or 'video' in part %}" + video;
  return "{% if message['content'] is string %}{{ message['content'] | replace('<image>', '" + separator +
         image + separator + "')" + videos +
         " }}{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' or 'image' in "
         "part "
         "or 'image_url' in part %}" +
         separator + image + separator + video_part +
         "{% elif 'text' in part %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}";
}

}  // namespace

std::string chatml_template_jinja(const std::string& default_system, const ImageBlock& block) {
  // The text stands outside the template's tags: only what opens a tag cannot be written there.
  for (const char* tag : {"{{", "{%", "{#"})
    if (default_system.find(tag) != std::string::npos)
      throw DataError(fmt::format("the default system message cannot hold '{}' in a chat template", tag));
  const std::string system = default_system.empty()
                                 ? ""
                                 : "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n" +
                                       default_system + "<|im_end|>\n{% endif %}";
  return "{% for message in messages %}" + system + "<|im_start|>{{ message['role'] }}\n" +
         content_jinja(block.template_text(), "",
                       block.video_pad.empty() ? "" : block.start + block.video_pad + block.end) +
         "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
}

std::string vqa_template_jinja(const ImageBlock& block) {
  return "{% for message in messages %}<|im_start|>{{ message['role'] }} " +
         content_jinja(block.template_text(), " ") +
         " <|im_end|>{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant {% endif %}";
}

}  // namespace loom::data
